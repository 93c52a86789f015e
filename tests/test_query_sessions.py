"""Query conversations in the sidecar's storage: 10-turn sliding window, 30-minute idle
expiry, follow-ups across a restart (a new Conversations on the same database)."""
from __future__ import annotations

import pytest

from fabricscope.queryapi.query.sessions import BadSessionId, Conversations
from fabricscope.queryapi.storage import open_storage


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def storage(tmp_path):
    store = open_storage(str(tmp_path / "sidecar.db"))
    yield store
    store.close()


def test_window_keeps_the_last_ten_turns_and_survives_reopening(storage, tmp_path):
    clock = Clock()
    conversations = Conversations(storage, clock)
    conversation = conversations.open(None)
    for i in range(13):
        conversations.record(conversation, {"message": f"q{i}", "query_name": "fleet_summary", "params": {}})
        clock.now += 60
    reopened = Conversations(storage, clock).open(conversation.session_id)
    assert [t["message"] for t in reopened.turns] == [f"q{i}" for i in range(3, 13)]
    assert reopened.renewed is None


def test_previous_is_the_last_turn_that_resolved(storage):
    conversations = Conversations(storage, Clock())
    conversation = conversations.open(None)
    conversations.record(conversation, {"message": "a", "query_name": "link_flaps", "params": {"window": "1h"}})
    conversations.record(conversation, {"message": "b", "query_name": None, "params": {}})
    assert conversations.open(conversation.session_id).previous() == {"query_name": "link_flaps",
                                                                     "params": {"window": "1h"}}


def test_idle_session_expires_after_thirty_minutes(storage):
    clock = Clock()
    conversations = Conversations(storage, clock)
    conversation = conversations.open(None)
    conversations.record(conversation, {"message": "a", "query_name": "link_flaps", "params": {}})
    clock.now += 29 * 60
    assert conversations.open(conversation.session_id).session_id == conversation.session_id
    clock.now += 31 * 60
    renewed = conversations.open(conversation.session_id)
    assert renewed.session_id != conversation.session_id and renewed.turns == []
    assert "idle for more than 30 minutes" in renewed.renewed


def test_unknown_and_malformed_session_ids(storage):
    conversations = Conversations(storage, Clock())
    unknown = conversations.open("00000000-0000-4000-8000-000000000000")
    assert unknown.renewed.startswith("unknown session_id") and unknown.turns == []
    for bad in ("'; DROP TABLE sessions; --", "x" * 64, 42, "00000000-0000-4000-8000-00000000000G"):
        with pytest.raises(BadSessionId):
            conversations.open(bad)
