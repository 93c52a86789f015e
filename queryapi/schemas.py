"""Response and request models shared by the sidecar's blueprints (pydantic; apiflask
turns them into the OpenAPI document)."""
from __future__ import annotations

from pydantic import BaseModel


class VersionsOut(BaseModel):
    api_versions: list[str]
    version: str
    capabilities: list[str]


class HealthOut(BaseModel):
    status: str
    version: str | None = None
    schema_version: int | None = None
    storage: str | None = None
    prometheus: str | None = None
