"""Query conversations (seed §14.6): a sliding window of the last 10 turns per session,
expiring after 30 minutes without a message, kept in the sidecar's storage (the
`sessions` table) so a restart or another replica continues the conversation."""
from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

WINDOW_TURNS = 10
IDLE_EXPIRY_SECONDS = 30 * 60
_SESSION_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class BadSessionId(ValueError):
    pass


@dataclass
class Conversation:
    session_id: str
    turns: list[dict[str, Any]] = field(default_factory=list)
    renewed: str | None = None       # why a given session_id was not continued

    def previous(self) -> dict[str, Any] | None:
        """The last turn that resolved to a query: what a follow-up refers to."""
        for turn in reversed(self.turns):
            if turn.get("query_name"):
                return {"query_name": turn["query_name"], "params": turn.get("params") or {}}
        return None


class Conversations:
    def __init__(self, storage, clock: Callable[[], float] = time.time,
                 window: int = WINDOW_TURNS, idle_expiry: float = IDLE_EXPIRY_SECONDS) -> None:
        self.storage, self.clock, self.window, self.idle_expiry = storage, clock, window, idle_expiry

    def open(self, session_id: Any) -> Conversation:
        if session_id is None:
            return Conversation(str(uuid.uuid4()))
        if not isinstance(session_id, str) or not _SESSION_ID.fullmatch(session_id):
            raise BadSessionId("session_id must be a lower-case UUID as returned by a previous response")
        stored = self.storage.load_session(session_id)
        if stored is None:
            return Conversation(str(uuid.uuid4()), renewed="unknown session_id: a new session was started")
        data = stored["data"]
        if self.clock() - float(data.get("last_active", 0)) > self.idle_expiry:
            return Conversation(str(uuid.uuid4()),
                                renewed=f"session idle for more than {self.idle_expiry / 60:g} minutes: "
                                        "a new session was started")
        return Conversation(session_id, list(data.get("turns") or []))

    def record(self, conversation: Conversation, turn: dict[str, Any]) -> None:
        conversation.turns = (conversation.turns + [turn])[-self.window:]
        self.storage.save_session(conversation.session_id,
                                  {"turns": conversation.turns, "last_active": self.clock()})
