"""LLM providers against a local HTTP server started here, with the real SDKs as clients
(openai for OpenAI-compatible, anthropic for Anthropic; Ollama over urllib).

The server speaks the three wire formats and answers what each test queues, so the tests
see what a real provider would cause: a registered query is used, an unregistered one or
hostile parameters are refused, a slow or failing provider falls back to the
deterministic match."""
from __future__ import annotations

import json
import time

import pytest

from fabricscope.httpserver import HttpServer, read_body, respond
from fabricscope.queryapi.query import llm
from fabricscope.queryapi.query.extract import Vocabulary
from fabricscope.queryapi.query.nl import Interpreter
from fabricscope.queryapi.query.registry import default_registry

VOCAB = Vocabulary(["gpu-node-0", "gpu-node-1"])


class FakeProvider:
    def __init__(self) -> None:
        self.answers: list[tuple[str, object]] = []
        self.requests: list[tuple[str, dict]] = []
        provider = self

        def app(environ, start_response):
            path = environ["PATH_INFO"]
            body = json.loads(read_body(environ, 1 << 20))
            provider.requests.append((path, body))
            kind, value = provider.answers.pop(0) if provider.answers else ("text", "{}")
            if kind == "sleep":
                time.sleep(value)
                return respond(start_response, 200, b"", "application/json")
            if kind == "status":
                return respond(start_response, value, b"", "application/json")
            if path.endswith("/chat/completions"):
                reply = {"id": "c1", "object": "chat.completion", "created": 0, "model": body["model"],
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": value}}],
                         "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
            elif path.endswith("/messages"):
                reply = {"id": "m1", "type": "message", "role": "assistant", "model": body["model"],
                         "content": [{"type": "text", "text": value}], "stop_reason": "end_turn",
                         "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}
            else:   # Ollama /api/chat
                reply = {"model": body["model"], "message": {"role": "assistant", "content": value}, "done": True}
            return respond(start_response, 200, json.dumps(reply).encode(), "application/json")

        # Threads enough that a "sleep" answer (the timeout test) never holds up the others.
        self.server = HttpServer(app, name="fake-llm-provider", threads=8, timeout=30).start()
        self.url = self.server.url

    def close(self) -> None:
        self.server.stop()


@pytest.fixture(scope="module")
def provider():
    fake = FakeProvider()
    yield fake
    fake.close()


@pytest.fixture
def fake(provider):
    provider.answers.clear()
    provider.requests.clear()
    return provider


def _interpreter(config) -> Interpreter:
    registry = default_registry()
    return Interpreter(registry, llm.Refiner(registry, config))


@pytest.mark.parametrize("env,provider_name", [
    ({}, None),
    ({"ANTHROPIC_API_KEY": "a", "OPENAI_API_KEY": "o", "OLLAMA_URL": "http://x", "LLM_BASE_URL": "http://y"}, "anthropic"),
    ({"OPENAI_API_KEY": "o", "OLLAMA_URL": "http://x", "LLM_BASE_URL": "http://y"}, "openai"),
    ({"OLLAMA_URL": "http://x", "LLM_BASE_URL": "http://y"}, "ollama"),
    ({"LLM_BASE_URL": "http://y"}, "openai_compatible"),
    ({"LLM_PROVIDER": "vllm", "LLM_BASE_URL": "http://y", "ANTHROPIC_API_KEY": "a"}, "openai_compatible"),
    ({"LLM_PROVIDER": "ollama", "OPENAI_API_KEY": "o"}, "ollama"),
])
def test_detection_priority(env, provider_name):
    config = llm.detect(env)
    assert (config.provider if config else None) == provider_name


def test_overrides_and_defaults():
    config = llm.detect({"OPENAI_API_KEY": "o", "LLM_MODEL": "gpt-x", "LLM_BASE_URL": "http://gw/v1",
                         "LLM_API_KEY": "k2", "LLM_TIMEOUT": "2.5"})
    assert (config.model, config.base_url, config.api_key, config.timeout) == ("gpt-x", "http://gw/v1", "k2", 2.5)
    assert llm.detect({"LLM_BASE_URL": "http://h/v1"}).api_key == "local"
    assert llm.detect({"OLLAMA_URL": "http://o:11434"}).model == "llama3.2"
    assert "k2" not in json.dumps(config.status())


@pytest.mark.parametrize("env,message", [
    ({"LLM_PROVIDER": "gemini"}, "is not one of"),
    ({"LLM_PROVIDER": "openai"}, "needs OPENAI_API_KEY"),
    ({"LLM_PROVIDER": "lmstudio"}, "needs LLM_BASE_URL"),
    ({"OPENAI_API_KEY": "o", "LLM_TIMEOUT": "soon"}, "LLM_TIMEOUT"),
])
def test_bad_configuration_is_a_clear_error(env, message):
    with pytest.raises(llm.ProviderConfigError, match=message):
        llm.detect(env)


def test_openai_compatible_refines_to_a_registered_query(fake):
    config = llm.detect({"LLM_PROVIDER": "llama_cpp", "LLM_BASE_URL": fake.url + "/v1", "LLM_MODEL": "tiny"})
    fake.answers.append(("text", 'Sure! {"query_name": "link_flaps", "params": {"host": "gpu-node-1", "window": "2h"}}'))
    result = _interpreter(config).interpret("is the cable on gpu-node-1 loose?", VOCAB)
    assert result.llm["used"] is True
    assert (result.match.query_name, result.match.params) == ("link_flaps", {"host": "gpu-node-1", "window": "2h"})
    path, body = fake.requests[0]
    assert path == "/v1/chat/completions" and body["model"] == "tiny"
    assert "link_flaps" in body["messages"][0]["content"]          # the catalog went to the model
    assert json.loads(body["messages"][1]["content"])["extracted_parameters"] == {"host": "gpu-node-1"}


def test_the_model_cannot_relax_the_answer_contract(fake):
    """An action, an unknown name or a constraint no query takes is refused before any model
    is asked: a model's pick cannot turn them into a run."""
    config = llm.detect({"LLM_BASE_URL": fake.url + "/v1"})
    fake.answers.extend([("text", '{"query_name": "exporters_down", "params": {}}')] * 3)
    interpreter = _interpreter(config)
    for question in ("restart the exporter on gpu-node-1", "p99 latency of gpu-node-9", "nvlinks down in the last 2h"):
        result = interpreter.interpret(question, VOCAB)
        assert result.match.query_name is None and not result.llm, question
    assert fake.requests == []


def test_unregistered_query_from_the_model_is_refused(fake):
    config = llm.detect({"LLM_BASE_URL": fake.url + "/v1"})
    fake.answers.append(("text", '{"query_name": "raw_promql", "params": {"expr": "vector(1)"}}'))
    result = _interpreter(config).interpret("which links flapped today?", VOCAB)
    assert result.llm["used"] is False and "unregistered query 'raw_promql'" in result.llm["refused"]
    assert result.match.query_name == "link_flaps"            # the deterministic answer stands


def test_hostile_parameters_from_the_model_are_refused(fake):
    config = llm.detect({"LLM_BASE_URL": fake.url + "/v1"})
    fake.answers.append(("text", json.dumps({"query_name": "host_latency",
                                             "params": {"host": 'x"} or vector(1) #'}})))
    result = _interpreter(config).interpret("p99 latency of gpu-node-1", VOCAB)
    assert result.llm["used"] is False and "parameter 'host'" in result.llm["refused"]
    assert result.match.params["host"] == "gpu-node-1"


def test_slow_provider_times_out_and_falls_back(fake):
    config = llm.detect({"LLM_BASE_URL": fake.url + "/v1", "LLM_TIMEOUT": "0.3"})
    fake.answers.append(("sleep", 1.0))
    refiner = llm.Refiner(default_registry(), config)
    interpreter = Interpreter(default_registry(), refiner)
    started = time.monotonic()
    result = interpreter.interpret("which links flapped today?", VOCAB)
    assert time.monotonic() - started < 0.9
    assert result.llm["used"] is False and "Timeout" in result.llm["error"]
    assert result.match.query_name == "link_flaps"
    # cooling down: the next question does not wait on the provider again
    assert refiner.available() is False and refiner.status()["cooling_down"] is True
    assert interpreter.interpret("which links flapped today?", VOCAB).llm == {}


def test_provider_http_error_falls_back(fake):
    config = llm.detect({"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": fake.url + "/v1"})
    fake.answers.append(("status", 500))
    result = _interpreter(config).interpret("show xid errors", VOCAB)
    assert result.llm["used"] is False and result.llm["error"]
    assert result.match.query_name == "gpu_xid_errors"


def test_anthropic_sdk_against_the_local_server(fake):
    config = llm.detect({"ANTHROPIC_API_KEY": "sk-ant-test", "LLM_BASE_URL": fake.url})
    fake.answers.append(("text", '{"query_name": "firing_alerts", "params": {"severity": "page"}}'))
    result = _interpreter(config).interpret("is anything on fire?", VOCAB)
    assert fake.requests[0][0] == "/v1/messages"
    assert (result.match.query_name, result.match.params) == ("firing_alerts", {"severity": "critical"})


def test_ollama_over_urllib(fake):
    config = llm.detect({"OLLAMA_URL": fake.url, "LLM_MODEL": "llama3.2"})
    fake.answers.append(("text", '{"query_name": null}'))
    result = _interpreter(config).interpret("which nvlinks are down", VOCAB)
    assert fake.requests[0][0] == "/api/chat" and fake.requests[0][1]["format"] == "json"
    assert result.llm["used"] is False and result.match.query_name == "nvlink_links_down"


def test_sidecar_chat_status_and_preview_use_the_configured_provider(fake, tmp_path, monkeypatch):
    """The sidecar detects the provider from its environment at start; /chat/status shows it
    (never the key) and the parameter preview goes through it."""
    from fabricscope.queryapi.app import create_app
    from tests.sidecar_helpers import bearer, make_keys

    monkeypatch.setenv("LLM_PROVIDER", "vllm")
    monkeypatch.setenv("LLM_BASE_URL", fake.url + "/v1")
    monkeypatch.setenv("LLM_API_KEY", "sk-secret-value")
    monkeypatch.setenv("LLM_MODEL", "qwen-local")
    keys = make_keys(tmp_path / "keys.yaml")
    app = create_app({"insecure_no_tls": True, "database": str(tmp_path / "db"),
                      "keys_file": str(tmp_path / "keys.yaml"), "prometheus_url": "http://127.0.0.1:9",
                      "audit_log": str(tmp_path / "audit.log")})
    client = app.test_client()
    status = client.get("/chat/status")
    assert status.status_code == 200
    assert status.json == {"active": True, "provider": "openai_compatible", "model": "qwen-local",
                           "base_url": fake.url + "/v1", "timeout_seconds": 8.0, "cooling_down": False}
    assert "sk-secret-value" not in status.get_data(as_text=True)
    fake.answers.append(("text", '{"query_name": "ber_offenders", "params": {"window": "6h"}}'))
    preview = client.get("/ai/query/parameters", query_string={"message": "is the optics on mlx5_3 dying?"},
                         headers=bearer(keys["reader"])).json
    assert preview["llm"]["used"] is True and (preview["query_name"], preview["params"]) == \
        ("ber_offenders", {"window": "6h"})
    fake.answers.append(("text", '{"query_name": "drop_everything", "params": {}}'))
    refused = client.get("/ai/query/parameters", query_string={"message": "which links flapped today?"},
                         headers=bearer(keys["reader"])).json
    assert "unregistered query" in refused["llm"]["refused"] and refused["query_name"] == "link_flaps"
    app.extensions["fabricscope"].close()
