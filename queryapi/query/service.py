"""The query layer's operations, shared by the HTTP endpoints, the tools and MCP:
MeshQL, NL questions (one-shot and in a conversation) and the extraction preview."""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

from . import executor, meshql
from .calls import Caller
from .contract import abstention_answer
from .extract import Vocabulary
from .llm import ProviderConfigError, Refiner, detect
from .nl import Interpreter
from .registry import Registry, default_registry
from .sessions import Conversations
from .tools import ToolError, classify

log = logging.getLogger("fabricscope.queryapi.query")
VOCABULARY_TTL = 60.0
SERVICES_WINDOW = 6 * 3600
# One communicator per job id (a job's ranks share their world communicator; the first
# seen stands for the job when it has sub-communicators).
JOBS_PROMQL = 'max by (job_id, comm) (fabric_nccl_rank_info{job_id!=""})'
MAX_MESSAGE = 2000


def _message(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ToolError(422, "invalid_message", "`message` must be a non-empty string")
    if len(value) > MAX_MESSAGE:
        raise ToolError(422, "invalid_message", f"`message` is longer than {MAX_MESSAGE} characters")
    return value


class QueryService:
    def __init__(self, registry: Registry | None = None, refiner: Refiner | None = None) -> None:
        self.registry = registry or default_registry()
        if refiner is None:
            try:
                refiner = Refiner(self.registry, detect())
            except ProviderConfigError as exc:
                # The sidecar still answers questions; the status endpoint says why no LLM.
                log.error("LLM provider configuration: %s; answering without an LLM", exc)
                refiner = Refiner(self.registry, None)
                refiner.config_error = str(exc)
        self.refiner = refiner
        self.interpreter = Interpreter(self.registry, refiner)
        self._vocabulary: tuple[float, Vocabulary] | None = None
        self._lock = threading.Lock()

    # -- names Prometheus knows --------------------------------------------------------
    def vocabulary(self, state, caller: Caller | None = None) -> Vocabulary:
        """What the live cluster knows, refreshed every VOCABULARY_TTL seconds: hosts,
        devices, clusters and jobs (with their communicator) from Prometheus label values;
        devices, racks and PDUs from the chaos topology when the sidecar has one; services
        from the spans received in the last SERVICES_WINDOW. A source that fails leaves its
        kind empty; the others still resolve."""
        with self._lock:
            if self._vocabulary and time.monotonic() - self._vocabulary[0] < VOCABULARY_TTL:
                return self._vocabulary[1]
        names: dict[str, Any] = {"hosts": [], "devices": [], "clusters": [], "jobs": {}, "racks": [], "pdus": [],
                                 "services": []}
        try:
            names["hosts"] = state.prom.label_values("node")
            names["devices"] = state.prom.label_values("device")
            names["clusters"] = state.prom.label_values("cluster")
            for sample in state.prom.query(JOBS_PROMQL, timeout=state.config.prometheus_timeout_seconds):
                if sample.labels.get("job_id") and sample.labels.get("comm"):
                    names["jobs"].setdefault(sample.labels["job_id"], sample.labels["comm"])
        except Exception as exc:  # noqa: BLE001 - Prometheus down: patterns still work, its names are not recognised
            log.warning("cannot read names from Prometheus: %s", exc)
        chaos = getattr(state, "chaos", None)
        if chaos is not None:
            topology = chaos.topology.engine().topology
            names["devices"] = [*names["devices"], *topology.graph.nodes]
            names["racks"] = list(topology.racks)
            names["pdus"] = [n for n, kind in topology.graph.nodes(data="kind") if kind == "pdu"]
        try:
            names["services"] = state.storage.recent_services(int((time.time() - SERVICES_WINDOW) * 1000))
        except Exception as exc:  # noqa: BLE001 - the span store down: its names are not recognised
            log.warning("cannot read service names from the span store: %s", exc)
        vocabulary = Vocabulary(names["hosts"], names["devices"], racks=names["racks"], pdus=names["pdus"],
                                services=names["services"], clusters=names["clusters"], jobs=names["jobs"])
        with self._lock:
            self._vocabulary = (time.monotonic(), vocabulary)
        return vocabulary

    # -- MeshQL ------------------------------------------------------------------------
    def meshql(self, state, text: Any, execute: Any = True, caller: Caller | None = None) -> dict[str, Any]:
        if not isinstance(execute, bool):
            raise ToolError(422, "invalid_params", "`execute` must be true or false")
        statement = meshql.parse(text, self.registry)
        if not execute:
            return {"query_name": statement.query_name, "params": statement.params}
        return executor.run(state, self.registry, statement.query_name, statement.params, caller)

    # -- natural language --------------------------------------------------------------
    def parameters(self, state, message: Any, caller: Caller | None = None) -> dict[str, Any]:
        """Extraction preview: what would run, without running it."""
        return self.interpreter.interpret(_message(message), self.vocabulary(state, caller)).to_dict()

    def ask(self, state, message: Any, previous: dict[str, Any] | None = None, execute: Any = True,
            caller: Caller | None = None) -> dict[str, Any]:
        if not isinstance(execute, bool):
            raise ToolError(422, "invalid_params", "`execute` must be true or false")
        body = self._interpret(state, message, previous, caller)
        if execute:
            self._execute(state, body, caller)
        return body

    def _interpret(self, state, message: Any, previous: dict[str, Any] | None,
                   caller: Caller | None) -> dict[str, Any]:
        interpretation = self.interpreter.interpret(_message(message), self.vocabulary(state, caller), previous)
        body = interpretation.to_dict()
        match = interpretation.match
        if match.query_name is None:
            body["answer"] = abstention_answer(match)
        elif match.missing:
            body["answer"] = f"Query {match.query_name} needs: {', '.join(match.missing)}."
        elif match.covered:
            body["answer"] = (f"{match.query_name} covers every "
                              + ", ".join(f"{slot} (not split by {value})" for slot, value in match.covered.items())
                              + ": it has no finer breakdown.")
        return body

    def _execute(self, state, body: dict[str, Any], caller: Caller | None) -> None:
        if body.get("query_name") and not body.get("missing"):
            body.update(executor.run(state, self.registry, body["query_name"], body["params"], caller))

    def conversation(self, state, message: Any, session_id: Any,
                     caller: Caller | None = None) -> dict[str, Any]:
        message = _message(message)
        conversations = Conversations(state.storage)
        try:
            conversation = conversations.open(session_id)
        except ValueError as exc:
            raise ToolError(422, "invalid_session_id", str(exc)) from None
        body = self._interpret(state, message, conversation.previous(), caller)
        # Recorded before running: a follow-up can refer to this turn even if Prometheus
        # failed to answer it.
        conversations.record(conversation, {"message": message, "query_name": body.get("query_name"),
                                            "params": body.get("params") or {}, "at": time.time()})
        body["session_id"] = conversation.session_id
        body["turns"] = len(conversation.turns)
        if conversation.renewed:
            body["session_renewed"] = conversation.renewed
        try:
            self._execute(state, body, caller)
        except Exception as exc:  # noqa: BLE001 - classified below into the tool error shape
            # The turn is stored; the error names the session so the client can follow up.
            error = classify(exc)
            error.detail = {**error.detail, "session_id": conversation.session_id, "query_name": body["query_name"],
                            "params": body["params"]}
            raise error from None
        return body

    def chat_status(self) -> dict[str, Any]:
        status = self.refiner.status()
        error = getattr(self.refiner, "config_error", None)
        if error:
            status["config_error"] = error
        return status
