"""Vendor-agnostic LLM providers (Anthropic, OpenAI, Ollama, OpenAI-compatible) and the
refinement step that may use one.

Detection follows the environment in a fixed priority: LLM_PROVIDER if set, else
ANTHROPIC_API_KEY -> anthropic, OPENAI_API_KEY -> openai, OLLAMA_URL -> ollama,
LLM_BASE_URL -> openai_compatible. LLM_MODEL, LLM_BASE_URL and LLM_API_KEY override the
provider's defaults. No provider configured means deterministic matching only.

An LLM never writes PromQL: it may answer only with a registered query name and
parameters, which go through the registry's validation like anything a user types. A
refused, failed or slow answer leaves the deterministic result in place.
"""
from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Mapping

from .params import ParamError
from .registry import Registry, UnknownQuery

log = logging.getLogger("fabricscope.queryapi.query.llm")

PRIORITY = ("anthropic", "openai", "ollama", "openai_compatible")
ALIASES = {"vllm": "openai_compatible", "lmstudio": "openai_compatible", "llama_cpp": "openai_compatible",
           "openai-compatible": "openai_compatible", "claude": "anthropic"}
DEFAULT_MODELS = {"anthropic": "claude-3-5-sonnet-20241022", "openai": "gpt-4o", "ollama": "llama3.2",
                  "openai_compatible": "local"}
DEFAULT_OLLAMA_URL = "http://localhost:11434"
DEFAULT_TIMEOUT = 8.0
FAILURE_COOLDOWN = 30.0   # after a failure, skip the provider this long: questions stay fast


class ProviderConfigError(ValueError):
    """LLM_PROVIDER names something unknown, or a provider lacks what it needs."""


@dataclass(frozen=True)
class ProviderConfig:
    provider: str
    model: str
    api_key: str | None = None
    base_url: str | None = None
    timeout: float = DEFAULT_TIMEOUT

    def status(self) -> dict[str, Any]:
        """What GET /chat/status shows: never the key."""
        return {"active": True, "provider": self.provider, "model": self.model,
                "base_url": self.base_url, "timeout_seconds": self.timeout}


def detect(env: Mapping[str, str] | None = None) -> ProviderConfig | None:
    env = os.environ if env is None else env
    get = lambda name: (env.get(name) or "").strip() or None  # noqa: E731
    explicit = get("LLM_PROVIDER")
    if explicit:
        provider = ALIASES.get(explicit.lower(), explicit.lower())
        if provider not in PRIORITY:
            raise ProviderConfigError(f"LLM_PROVIDER={explicit!r} is not one of: "
                                      f"{', '.join(PRIORITY + tuple(ALIASES))}")
    elif get("ANTHROPIC_API_KEY"):
        provider = "anthropic"
    elif get("OPENAI_API_KEY"):
        provider = "openai"
    elif get("OLLAMA_URL"):
        provider = "ollama"
    elif get("LLM_BASE_URL"):
        provider = "openai_compatible"
    else:
        return None
    try:
        timeout = float(get("LLM_TIMEOUT") or DEFAULT_TIMEOUT)
    except ValueError:
        raise ProviderConfigError(f"LLM_TIMEOUT={get('LLM_TIMEOUT')!r} is not a number of seconds") from None
    model = get("LLM_MODEL") or DEFAULT_MODELS[provider]
    if provider == "anthropic":
        key = get("LLM_API_KEY") or get("ANTHROPIC_API_KEY")
        if not key:
            raise ProviderConfigError("LLM_PROVIDER=anthropic needs ANTHROPIC_API_KEY (or LLM_API_KEY)")
        return ProviderConfig(provider, model, key, get("LLM_BASE_URL"), timeout)
    if provider == "openai":
        key = get("LLM_API_KEY") or get("OPENAI_API_KEY")
        if not key:
            raise ProviderConfigError("LLM_PROVIDER=openai needs OPENAI_API_KEY (or LLM_API_KEY)")
        return ProviderConfig(provider, model, key, get("LLM_BASE_URL") or get("OPENAI_BASE_URL"), timeout)
    if provider == "ollama":
        return ProviderConfig(provider, model, None, get("LLM_BASE_URL") or get("OLLAMA_URL") or DEFAULT_OLLAMA_URL,
                              timeout)
    base_url = get("LLM_BASE_URL") or get("OPENAI_BASE_URL")
    if not base_url:
        raise ProviderConfigError(f"LLM_PROVIDER={explicit} needs LLM_BASE_URL (the server's /v1 URL)")
    return ProviderConfig(provider, model, get("LLM_API_KEY") or "local", base_url, timeout)


class ChatClient:
    """complete(system, user) -> the model's text; raises on any failure."""

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config

    def complete(self, system: str, user: str) -> str:
        raise NotImplementedError


class OpenAIClient(ChatClient):
    """OpenAI and every OpenAI-compatible server (vLLM, LM Studio, llama.cpp)."""

    def __init__(self, config: ProviderConfig) -> None:
        super().__init__(config)
        import openai
        self._client = openai.OpenAI(api_key=config.api_key, base_url=config.base_url,
                                     timeout=config.timeout, max_retries=0)

    def complete(self, system: str, user: str) -> str:
        response = self._client.chat.completions.create(
            model=self.config.model, temperature=0, max_tokens=400,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": user}])
        return response.choices[0].message.content or ""


class AnthropicClient(ChatClient):
    def __init__(self, config: ProviderConfig) -> None:
        super().__init__(config)
        import anthropic
        self._client = anthropic.Anthropic(api_key=config.api_key, base_url=config.base_url,
                                           timeout=config.timeout, max_retries=0)

    def complete(self, system: str, user: str) -> str:
        response = self._client.messages.create(model=self.config.model, max_tokens=400, system=system, messages=[{"role": "user", "content": user}])
        return "".join(block.text for block in response.content if getattr(block, "type", "") == "text")


class OllamaClient(ChatClient):
    """Ollama's /api/chat over the standard library: nothing to install."""

    def complete(self, system: str, user: str) -> str:
        body = json.dumps({"model": self.config.model, "stream": False, "format": "json",
                           "options": {"temperature": 0},
                           "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]})
        request = urllib.request.Request(self.config.base_url.rstrip("/") + "/api/chat", data=body.encode(),  # noqa: S310 - configured http(s) URL
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=self.config.timeout) as response:  # noqa: S310 (configured URL)
            return json.loads(response.read(1 << 20))["message"]["content"]


CLIENTS = {"anthropic": AnthropicClient, "openai": OpenAIClient, "ollama": OllamaClient,
           "openai_compatible": OpenAIClient}


def make_client(config: ProviderConfig) -> ChatClient:
    return CLIENTS[config.provider](config)


SYSTEM_PROMPT = """You map an operator's question about a GPU cluster to ONE registered query.
Answer with a single JSON object and nothing else:
{"query_name": "<one of the names listed>", "params": {"<param>": <value>, ...}}
Use only the query names and parameter names listed. If none fits, answer {"query_name": null}.
Registered queries (name: description; parameters):
"""


class Refiner:
    """Phase two of NL: ask the configured LLM to confirm or correct the deterministic match."""

    def __init__(self, registry: Registry, config: ProviderConfig | None, client: ChatClient | None = None) -> None:
        self.registry = registry
        self.config = config
        self._client = client
        self._lock = threading.Lock()
        self._failed_at: float | None = None
        self._catalog_text = "\n".join(
            f"- {q.name}: {q.description} params: "
            + (", ".join(f"{n} ({p.type}{', required' if p.required else ''})" for n, p in q.params.items()) or "none")
            for q in registry.queries.values())

    def available(self) -> bool:
        if self.config is None:
            return False
        with self._lock:
            return self._failed_at is None or time.monotonic() - self._failed_at > FAILURE_COOLDOWN

    def status(self) -> dict[str, Any]:
        if self.config is None:
            return {"active": False, "provider": None, "model": None,
                    "fallback": "deterministic extraction and catalog matching"}
        body = self.config.status()
        body["cooling_down"] = not self.available()
        return body

    def client(self) -> ChatClient:
        if self._client is None:
            self._client = make_client(self.config)
        return self._client

    def refine(self, message: str, extracted: dict[str, Any], deterministic: dict[str, Any],
               previous: dict[str, Any] | None = None) -> dict[str, Any]:
        """{'used': True, 'query_name', 'params'} or {'used': False, 'refused'|'error': why}.
        `previous` (the conversation's last query) lets the model resolve a follow-up."""
        base = {"provider": self.config.provider, "model": self.config.model}
        user = json.dumps({"question": message[:2000], "extracted_parameters": extracted,
                           "deterministic_match": deterministic, "previous_query": previous})
        started = time.monotonic()
        try:
            text = self.client().complete(SYSTEM_PROMPT + self._catalog_text, user)
        except Exception as exc:  # noqa: BLE001 - any provider failure: network, timeout, HTTP error, SDK error
            with self._lock:
                self._failed_at = time.monotonic()
            log.warning("LLM provider %s failed, using the deterministic match: %s", self.config.provider, exc)
            return {**base, "used": False, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        elapsed = round(time.monotonic() - started, 3)
        with self._lock:
            self._failed_at = None
        answer = _json_object(text)
        if answer is None:
            return {**base, "used": False, "seconds": elapsed, "refused": "the answer is not a JSON object"}
        name = answer.get("query_name")
        if name is None:
            return {**base, "used": False, "seconds": elapsed, "refused": "the model found no fitting query"}
        try:
            params = self.registry.validate(name, answer.get("params") or {})
        except UnknownQuery:
            return {**base, "used": False, "seconds": elapsed,
                    "refused": f"unregistered query {str(name)[:80]!r}: only registered queries can run"}
        except ParamError as exc:
            return {**base, "used": False, "seconds": elapsed, "refused": str(exc)}
        return {**base, "used": True, "seconds": elapsed, "query_name": name, "params": params}


def _json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in the answer (models like to wrap it in prose or fences)."""
    match = re.search(r"\{.*\}", text or "", re.S)
    if not match:
        return None
    try:
        value = json.loads(match.group(0))
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
