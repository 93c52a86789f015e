"""Sidecar configuration: flags over environment over defaults, validated before start-up
with the setting's name in every error."""
from __future__ import annotations

import pytest

from fabricscope.queryapi.config import ConfigError, load_config, slo_key


def test_flags_override_environment_which_overrides_defaults():
    env = {"FABRICSCOPE_SIDECAR_PORT": "19999", "FABRICSCOPE_SIDECAR_INSECURE_NO_TLS": "true",
           "FABRICSCOPE_SIDECAR_RATE_LIMIT_BURST": "7", "FABRICSCOPE_SIDECAR_GPU_HOUR_RATES": "default=2.5,h100=4"}
    config = load_config({"port": 20001, "host": None}, env)
    assert config.port == 20001 and config.host == "127.0.0.1"
    assert config.rate_limit.burst == 7 and config.rate_limit.per_second == 50
    assert config.gpu_hour_rates == {"default": 2.5, "h100": 4.0}


def test_slo_overrides_come_from_the_seed_variables():
    config = load_config({"insecure_no_tls": True}, {"TRACING_SLO_llm_inference_generate": "1500"})
    assert slo_key("llm-inference", "generate") == "llm_inference_generate"
    assert config.slo_for("llm-inference", "generate") == 1500
    assert config.slo_for("llm-inference", "embed") == 2000


@pytest.mark.parametrize("flags, env, message", [
    ({}, {}, "TLS is required"),
    ({"insecure_no_tls": True}, {"FABRICSCOPE_SIDECAR_PROMETHEUS_URLS": "x"},
     "unknown environment variable FABRICSCOPE_SIDECAR_PROMETHEUS_URLS"),
    ({"insecure_no_tls": True, "port": 70000}, {}, "port: Input should be less than or equal to 65535"),
    ({"insecure_no_tls": True, "prometheus_url": "prometheus:9090"}, {}, "prometheus_url: Value error, must be an http"),
    ({"insecure_no_tls": True}, {"FABRICSCOPE_SIDECAR_TRUSTED_SOURCES": "10.0.0.0/8,10.0.0.300"},
     "trusted_sources: Value error, '10.0.0.300' is not an IP address or CIDR network"),
    ({"insecure_no_tls": True}, {"TRACING_SLO_a_b": "fast"}, "TRACING_SLO_a_b='fast': expected a number"),
    ({"insecure_no_tls": True}, {"TRACING_SLO_a_b": "0"}, "an SLO must be > 0 ms"),
    ({"insecure_no_tls": True, "gpu_hour_rates": "h100=4"}, {}, "needs a 'default' rate class"),
    ({"insecure_no_tls": True, "gpu_hour_rates": "h100"}, {}, "is not CLASS=DOLLARS_PER_GPU_HOUR"),
    ({"tls_cert": "/nonexistent.pem", "tls_key": "/nonexistent.key"}, {}, "TLS file /nonexistent.pem does not exist"),
])
def test_bad_settings_stop_start_up_naming_the_setting(flags, env, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("'", ".")):
        load_config(flags, env)


@pytest.mark.parametrize("content", ["keys: [this is not\n", None])
def test_an_unreadable_keys_file_stops_start_up_with_one_line(tmp_path, content):
    """Broken YAML, or a FIFO where the keys file should be: exit 2, no traceback, no hang."""
    import os
    import subprocess

    from fabricscope.demo.stack.sidecar import sidecar_argv

    keys = tmp_path / "keys.yaml"
    if content is None:
        os.mkfifo(keys)
    else:
        keys.write_text(content)
    result = subprocess.run(sidecar_argv("--insecure-no-tls", "--keys-file", str(keys), "--database",
                                         str(tmp_path / "db.sqlite"), "--port", "0"),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("fabricscope sidecar: ") and str(keys) in result.stderr
