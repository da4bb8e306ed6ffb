"""One source of defaults: every DEEPSPEC_* variable of the settings reaches the process the CLI builds, and a flag
overrides it only when given (issue 43 item 6: `DEEPSPEC_GATEWAY_HTTP_PORT=9999 python -m service gateway` listened
on 8000, because the CLI repeated the settings' defaults as flag defaults and passed them as explicit values)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from service.cli import parse_config
from service.gateway.settings import GatewaySettings
from service.worker.settings import EmbeddedWorkerSettings, WorkerSettings
from tests.ports import free_port
from tests.service.conftest import gateway_of, worker_of

REPO = Path(__file__).resolve().parents[2]

#: a value other than the default for every field, as its environment variable spells it, and as the field holds it
GATEWAY_ENV = {
    "workers": ("w1:7001,w2:7002", "w1:7001,w2:7002"),
    "worker_protocol": ("openai-http", "openai-http"),
    "openai_max_outstanding": ("5", 5),
    "discovery": ("static", "static"),
    "k8s_api_url": ("https://api.example:6443", "https://api.example:6443"),
    "http_port": ("9999", 9999),
    "grpc_port": ("-1", -1),
    "request_timeout_s": ("12.5", 12.5),
    "health_interval_s": ("0.5", 0.5),
    "unhealthy_threshold": ("4", 4),
    "dns_refresh_s": ("7", 7.0),
    "max_body_bytes": ("65536", 65536),
    "max_attempts": ("2", 2),
    "retry_after_s": ("3", 3),
    "metrics_port": ("9102", 9102),
    "ready_without_workers": ("true", True),
    "service_classes": (
        '{"keys": {"sk-a": {"service_class": "batch"}}}',
        '{"keys": {"sk-a": {"service_class": "batch"}}}',
    ),
    "max_inflight_per_worker": ("4", 4),
    "interactive_reserve_per_worker": ("2", 2),
    "max_waiting": ("9", 9),
    "queue_timeout_s": ("5", 5.0),
    "routing": ("p2c", "p2c"),
    "routing_load_max_age_s": ("2", 2.0),
    "host": ("127.0.0.2", "127.0.0.2"),
    "drain_timeout_s": ("4", 4.0),
}
WORKER_ENV = {
    "target": ("stub", "stub"),
    "draft": ("prompt-lookup", "prompt-lookup"),
    "backend": ("pytorch", "pytorch"),
    "port": ("9101", 9101),
    "metrics_port": ("-1", -1),
    "device": ("cuda", "cuda"),
    "dtype": ("float32", "float32"),
    "quantization": ("none", "none"),
    "chat_template": ("qwen", "qwen"),
    "max_batch_size": ("3", 3),
    "max_queue": ("5", 5),
    "max_prefill_tokens_per_step": ("128", 128),
    "max_seq_len": ("1024", 1024),
    "kv_cache_memory_fraction": ("0.25", 0.25),
    "num_speculative_tokens": ("4", 4),
    "planner": ("verify-all", "verify-all"),
    "stub_step_ms": ("1.5", 1.5),
    "host": ("127.0.0.3", "127.0.0.3"),
    "drain_timeout_s": ("6", 6.0),
}
#: fields set another way: the keys file must exist (tested below), the API keys have their own variable name,
#: bundle_dir must hold a manifest (tests/service/test_bundle.py), the service classes file must exist
#: (tests/service/test_admission.py reads one); engine and engine_dir are the deprecated names of backend and
#: bundle_dir (tests/service/test_backend_vocabulary.py)
SET_ELSEWHERE = {"api_keys_file", "api_keys", "bundle_dir", "service_classes_file", "engine", "engine_dir"}


def _set(monkeypatch, prefix: str, table: dict) -> None:
    for name, (text, _) in table.items():
        monkeypatch.setenv(prefix + name.upper(), text)


def test_the_tables_cover_every_field():
    """A field added to the settings must be added here too, with a non-default value, or this test fails."""
    assert set(GATEWAY_ENV) | SET_ELSEWHERE >= set(GatewaySettings.model_fields)
    assert set(WORKER_ENV) | SET_ELSEWHERE >= set(WorkerSettings.model_fields)
    for model, table in ((GatewaySettings, GATEWAY_ENV), (WorkerSettings, WORKER_ENV)):
        for name, (_, value) in table.items():
            if name != "discovery":  # None by default, "static" once the workers imply it
                assert model.model_fields[name].default != value, name


def test_every_gateway_variable_reaches_thegateway_of(monkeypatch):
    _set(monkeypatch, "DEEPSPEC_GATEWAY_", GATEWAY_ENV)
    gateway = gateway_of(parse_config(["gateway"]))
    for name, (_, value) in GATEWAY_ENV.items():
        assert getattr(gateway, name) == value, name


def test_every_worker_variable_reaches_theworker_of(monkeypatch):
    _set(monkeypatch, "DEEPSPEC_WORKER_", WORKER_ENV)
    worker = worker_of(parse_config(["worker"]))
    for name, (_, value) in WORKER_ENV.items():
        assert getattr(worker, name) == value, name


def test_the_embedded_default_reads_both_prefixes(monkeypatch):
    _set(monkeypatch, "DEEPSPEC_GATEWAY_", {k: GATEWAY_ENV[k] for k in ("http_port", "grpc_port", "max_body_bytes")})
    _set(monkeypatch, "DEEPSPEC_WORKER_", {k: WORKER_ENV[k] for k in ("max_batch_size", "port", "metrics_port")})
    config = parse_config([])
    gateway, worker = gateway_of(config), worker_of(config)
    assert (gateway.http_port, gateway.grpc_port, gateway.max_body_bytes) == (9999, -1, 65536)
    assert (worker.max_batch_size, worker.port, worker.metrics_port) == (3, 9101, -1)
    assert isinstance(worker, EmbeddedWorkerSettings) and worker.host == "127.0.0.1"


def test_the_embedded_worker_defaults_to_loopback_and_any_free_port(monkeypatch):
    for name in os.environ:
        if name.startswith(("DEEPSPEC_WORKER_", "DEEPSPEC_GATEWAY_")):
            monkeypatch.delenv(name)
    config = parse_config(["--host", "0.0.0.0", "--max-batch-size", "2"])
    gateway, worker = gateway_of(config), worker_of(config)
    assert (worker.host, worker.port, worker.metrics_port) == ("127.0.0.1", 0, 8002)
    assert gateway.host == "0.0.0.0" and worker.max_batch_size == 2
    assert worker_of(parse_config(["--worker-port", "9300", "--metrics-port", "-1"])).port == 9300


def test_a_flag_given_overrides_the_environment(monkeypatch):
    _set(monkeypatch, "DEEPSPEC_GATEWAY_", {k: GATEWAY_ENV[k] for k in ("http_port", "workers", "request_timeout_s")})
    _set(monkeypatch, "DEEPSPEC_WORKER_", {k: WORKER_ENV[k] for k in ("max_batch_size", "target", "port")})
    gateway = gateway_of(parse_config(["gateway", "--http-port", "7000"]))
    assert (gateway.http_port, gateway.request_timeout_s, gateway.workers) == (7000, 12.5, "w1:7001,w2:7002")
    worker = worker_of(parse_config(["worker", "--max-batch-size", "6", "--port", "0"]))
    assert (worker.max_batch_size, worker.port, worker.target) == (6, 0, "stub")


def test_keys_come_from_their_variables(monkeypatch, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("k1\n# comment\nk2, k3\n")
    monkeypatch.setenv("DEEPSPEC_GATEWAY_API_KEYS_FILE", str(keys))
    monkeypatch.setenv("DEEPSPEC_API_KEYS", "k4")
    gateway = gateway_of(parse_config(["gateway", "--workers", "w:1"]))
    assert gateway.load_api_keys() == {"k1", "k2", "k3", "k4"}


def test_a_gateway_without_workers_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.delenv("DEEPSPEC_GATEWAY_WORKERS", raising=False)
    with pytest.raises(SystemExit) as exit_:
        parse_config(["gateway"])
    assert exit_.value.code == 2 and "DEEPSPEC_GATEWAY_WORKERS" in capsys.readouterr().err


def test_a_bad_variable_is_a_usage_error_naming_the_field(monkeypatch, capsys):
    monkeypatch.setenv("DEEPSPEC_WORKER_MAX_BATCH_SIZE", "0")
    with pytest.raises(SystemExit):
        parse_config(["worker"])
    assert "--max-batch-size" in capsys.readouterr().err


def test_help_shows_the_settings_defaults(capsys):
    from service.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser(("gateway",)).parse_args(["gateway", "--help"])
    text = capsys.readouterr().out
    assert "(default 8000)" in text and "(default 50051; -1 = off)" in text


@pytest.mark.integration
def test_the_real_gateway_listens_on_the_port_its_variable_names(tmp_path):
    """The bug as a deployment meets it: a pod configured by environment only."""
    port, grpc = free_port(), free_port()
    env = {
        **os.environ,
        "DEEPSPEC_GATEWAY_HTTP_PORT": str(port),
        "DEEPSPEC_GATEWAY_GRPC_PORT": str(grpc),
        "DEEPSPEC_GATEWAY_WORKERS": "127.0.0.1:1",
        "DEEPSPEC_GATEWAY_READY_WITHOUT_WORKERS": "1",
    }
    log = tmp_path / "gateway.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service", "gateway"], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                live = httpx.get(f"http://127.0.0.1:{port}/health/live", timeout=1)
                ready = httpx.get(f"http://127.0.0.1:{port}/health/ready", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            pytest.fail(f"the gateway did not listen on {port}:\n{log.read_text()[-3000:]}")
        assert live.status_code == 200 and ready.status_code == 200  # READY_WITHOUT_WORKERS taken as well
        with socket.create_connection(("127.0.0.1", grpc), timeout=2):  # and the gRPC port
            pass
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_admission_and_routing_flags_reach_thegateway_of(tmp_path):
    classes = tmp_path / "classes.yaml"
    classes.write_text("keys: {sk-agent: {service_class: interactive, session_memory: true}}\n")
    gateway = gateway_of(
        parse_config(
            [
                "gateway",
                "--workers",
                "127.0.0.1:1",
                "--service-classes-file",
                str(classes),
                "--max-inflight-per-worker",
                "4",
                "--interactive-reserve-per-worker",
                "2",
                "--max-waiting",
                "0",
                "--queue-timeout-s",
                "2.5",
                "--routing",
                "p2c",
                "--routing-load-max-age-s",
                "9",
            ]
        )
    )
    assert (
        gateway.service_classes_file,
        gateway.max_inflight_per_worker,
        gateway.interactive_reserve_per_worker,
        gateway.max_waiting,
        gateway.queue_timeout_s,
        gateway.routing,
        gateway.routing_load_max_age_s,
    ) == (classes, 4, 2, 0, 2.5, "p2c", 9.0)
    assert gateway.load_service_classes().keys == frozenset({"sk-agent"})
    inline = parse_config(["gateway", "--workers", "127.0.0.1:1", "--service-classes", "default: {weight: 3}"])
    assert gateway_of(inline).load_service_classes().default.weight == 3
