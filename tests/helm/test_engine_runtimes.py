"""worker.runtime vllm, sglang, trtllm-serve: the chart runs the engine's own server on the launch script that
`python -m export` wrote, so the launch flags have one source of truth.

The end-to-end check renders each runtime profile, runs the rendered export init container script for real (a tiny
Llama target and an EAGLE-3 draft, tests/export/conftest.py), then runs the rendered worker command against that
export with a stand-in engine binary on PATH, and compares the argv the engine receives with the launch command
the export recorded in manifest.json plus the flags the chart appends. The engines' flag names, probe endpoints and
drain behaviour are read in their sources (each test names the file and function).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helm_python.errors import HelmError

from tests.helm.conftest import REPO, RUNTIME_PROFILES, VALUE_SETS, container, one, render, render_files, workload

#: worker.runtime -> (export format, launch script, manifest `launch` key, the engine executable the script runs)
ENGINES = {
    "vllm": ("vllm", "vllm.sh", "vllm", "vllm"),
    "sglang": ("sglang", "sglang.sh", "sglang", "python"),
    "trtllm-serve": ("tensorrt-llm", "trtllm-serve.sh", "trtllm-serve", "trtllm-serve"),
}

#: the flags the chart may append, as each engine's CLI declares them:
#: vllm-project/vllm vllm/entrypoints/openai/cli_args.py `make_arg_parser` (FrontendArgs `--host`, `--port`),
#: vllm/engine/arg_utils.py `EngineArgs.add_cli_args` (`--served-model-name`, `--max-num-seqs`, `--max-model-len`,
#: `--shutdown-timeout`, the latter from PR #34730 / #36666); sgl-project/sglang python/sglang/srt/server_args.py
#: `ServerArgs.add_cli_args` (`--host`, `--port`, `--served-model-name`, `--max-running-requests`,
#: `--context-length`, `--enable-metrics`);
#: NVIDIA/TensorRT-LLM tensorrt_llm/commands/serve.py `serve` (click options `--host`, `--port`,
#: `--max_batch_size`, `--max_seq_len`)
ENGINE_FLAGS = {
    "vllm": {"--host", "--port", "--served-model-name", "--max-num-seqs", "--max-model-len", "--shutdown-timeout"},
    "sglang": {
        "--host",
        "--port",
        "--served-model-name",
        "--max-running-requests",
        "--context-length",
        "--enable-metrics",
    },
    "trtllm-serve": {"--host", "--port", "--max_batch_size", "--max_seq_len"},
}

#: the tensor-parallel flag each engine takes, as the launch script must carry it (vLLM `--tensor-parallel-size`,
#: SGLang `--tp` (`ServerArgs.add_cli_args`: `--tensor-parallel-size`, `--tp-size`, `--tp`), trtllm-serve
#: `tensor_parallel_size` in the YAML, which overrides its CLI (`serve`: "Path to a YAML file that overwrites the
#: parameters specified by trtllm-serve"))
TP_FLAGS = {"vllm": "--tensor-parallel-size", "sglang": "--tp"}

FAKE_ENGINE = """#!{python}
import json, os, sys
with open(os.environ["FAKE_ENGINE_OUT"], "w") as f:
    json.dump({{"argv": sys.argv[1:], "pid": os.getpid(), "cwd": os.getcwd()}}, f)
"""


def _pod(values: dict) -> tuple[list[dict], dict, dict]:
    docs = render(values)
    spec = workload(docs, "worker")["spec"]["template"]["spec"]
    return docs, spec, one(docs, "ConfigMap", "model")["data"]


def _expand(text: str, env: dict) -> str:
    """Kubernetes' `$(VAR)` expansion of command and args."""
    for key, value in env.items():
        text = text.replace(f"$({key})", value)
    return text


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    from tests.export.conftest import write_draft, write_hf_target

    root = tmp_path_factory.mktemp("tiny")
    target = write_hf_target(root / "target", "llama")
    return target, write_draft(root / "eagle3", target, "eagle3")


def _pod_env(config: dict, tmp: Path, target: Path, draft: Path) -> dict:
    """What the containers' environment holds, pointed at this machine's paths."""
    env = {
        **os.environ,
        **config,
        "DEEPSPEC_TARGET": str(target),
        "DEEPSPEC_DRAFT": str(draft),
        "DEEPSPEC_BUNDLE_DIR": str(tmp / "bundles" / "bundle"),
        "DEEPSPEC_CACHE_DIR": str(tmp / "cache"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(REPO),
    }
    return env


def _run_init(spec: dict, env: dict) -> subprocess.CompletedProcess:
    init = container(spec, "export-bundle")
    assert init["command"] == ["/bin/sh", "-ec"]
    return subprocess.run(
        ["/bin/sh", "-ec", _expand(init["args"][0], env)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def exports(tiny, tmp_path_factory) -> dict:
    """profile -> (runtime, rendered pod spec, pod environment, export dir) after the rendered init container ran
    (one export per profile, shared by the tests)."""
    from concurrent.futures import ThreadPoolExecutor

    pods = {}
    for name in RUNTIME_PROFILES:
        _, spec, config = _pod(VALUE_SETS[name])
        pods[name] = spec, _pod_env(config, tmp_path_factory.mktemp(name), *tiny)
    with ThreadPoolExecutor(len(pods)) as pool:  # three processes: their start-up (torch imports) overlaps
        results = dict(zip(pods, pool.map(lambda pod: _run_init(*pod), pods.values())))
    done = {}
    for name, (spec, env) in pods.items():
        assert results[name].returncode == 0, results[name].stderr[-3000:]
        done[name] = VALUE_SETS[name]["worker"]["runtime"], spec, env, Path(env["DEEPSPEC_BUNDLE_DIR"])
    return done


@pytest.fixture(params=RUNTIME_PROFILES)
def exported(request, exports):
    return exports[request.param]


def test_the_worker_execs_the_launch_command_the_export_wrote(exported, tmp_path):
    """The argv the engine gets is the export's launch command (manifest.json `launch`) followed by the chart's own
    flags, in the export directory (the command names the draft and trtllm-serve.yaml relative to it), and the
    engine *is* the container's first process: the script execs it, so the SIGTERM of a drain reaches the engine
    instead of a shell that, as PID 1, ignores it."""
    runtime, spec, env, out = exported
    fmt, script, key, binary = ENGINES[runtime]
    worker = container(spec, "worker")
    command = [_expand(c, env) for c in worker["command"]]
    assert command == ["sh", str(out / "launch" / script)]
    chart_args = [_expand(a, env) for a in worker["args"]]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == fmt == env["DEEPSPEC_EXPORT_FORMAT"]
    launch = shlex.split(manifest["launch"][key])
    assert launch[0] == binary

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / binary).write_text(FAKE_ENGINE.format(python=sys.executable))
    (bin_dir / binary).chmod(0o755)
    record = tmp_path / "engine.json"
    proc = subprocess.Popen(
        command + chart_args,
        cwd="/",
        env={**env, "FAKE_ENGINE_OUT": str(record), "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}"},
    )
    assert proc.wait(timeout=60) == 0
    seen = json.loads(record.read_text())
    assert seen["argv"] == launch[1:] + chart_args
    assert seen["pid"] == proc.pid  # exec: no shell left between the container runtime and the engine
    assert Path(seen["cwd"]) == out
    relative = [a for a in launch[1:] if a in ("draft", "trtllm-serve.yaml")]
    spec_json = [json.loads(a) for a in launch[1:] if a.startswith("{")]
    assert relative or spec_json, launch
    for path in relative + [s["model"] for s in spec_json]:
        assert (out / path).exists(), path


def test_the_launch_script_carries_tensor_parallelism_and_the_draft_length(exported):
    """Tensor parallelism reaches the engine through its own flag, written by `python -m export --tp` from
    worker.openai.tensorParallel, and the draft length from model.numSpeculativeTokens; the chart appends neither,
    so the two can never disagree."""
    runtime, spec, env, out = exported
    tp = str(
        next(VALUE_SETS[n] for n in RUNTIME_PROFILES if VALUE_SETS[n]["worker"]["runtime"] == runtime)["worker"]
        .get("openai", {})
        .get("tensorParallel", 1)
    )
    k = env["DEEPSPEC_NUM_SPECULATIVE_TOKENS"]
    launch = shlex.split(json.loads((out / "manifest.json").read_text())["launch"][ENGINES[runtime][2]])
    chart_flags = {a.split("=", 1)[0] for a in container(spec, "worker")["args"]}
    if runtime == "trtllm-serve":
        serve = yaml.safe_load((out / "trtllm-serve.yaml").read_text())
        assert serve["tensor_parallel_size"] == int(tp) and serve["speculative_config"]["max_draft_len"] == int(k)
        assert not chart_flags & {"--tp_size", "--tensor_parallel_size", "--config", "--extra_llm_api_options"}
    else:
        assert launch[launch.index(TP_FLAGS[runtime]) + 1] == tp
        assert not chart_flags & set(launch)  # no flag given twice (argparse would let the last one win silently)
        if runtime == "vllm":
            spec_config = json.loads(launch[launch.index("--speculative-config") + 1])
            assert spec_config["num_speculative_tokens"] == int(k)
        else:
            assert launch[launch.index("--speculative-num-steps") + 1] == k
    assert chart_flags <= ENGINE_FLAGS[runtime], chart_flags - ENGINE_FLAGS[runtime]


def test_trtllm_serve_config_turns_on_its_prometheus_endpoint(exports):
    """trtllm-serve mounts `/prometheus/metrics` only when the LLM args say `return_perf_metrics`, and fills its
    queue gauges from the iteration stats (`enable_iter_perf_stats`): NVIDIA/TensorRT-LLM
    tensorrt_llm/serve/openai_server.py `OpenAIServer.register_routes` / `mount_metrics`, `_init_llm`. The chart's
    ServiceMonitor scrapes that path (its `/metrics` is JSON iteration stats, not Prometheus text)."""
    serve = yaml.safe_load((exports["trtllm-serve"][3] / "trtllm-serve.yaml").read_text())
    assert serve["return_perf_metrics"] is True and serve["enable_iter_perf_stats"] is True
    docs = render(VALUE_SETS["trtllm-serve"])
    [endpoint] = one(docs, "ServiceMonitor", "worker")["spec"]["endpoints"]
    assert endpoint["path"] == "/prometheus/metrics"
    for name in ("vllm", "sglang"):
        [endpoint] = one(render(VALUE_SETS[name]), "ServiceMonitor", "worker")["spec"]["endpoints"]
        assert endpoint["path"] == "/metrics"


def test_a_restarted_pod_checks_the_target_its_launch_script_names(exports, tmp_path):
    """A finished export is skipped, but the launch script names the target's directory, and an alias or GGUF target
    lives in the pod's /cache, which a new pod starts without: the skip path resolves the target again (restoring
    a dequantized alias where the script expects it) and fails the init container when it is gone, instead of
    handing the engine a path that does not exist."""
    _, spec, env, _ = exports["vllm"]
    again = _run_init(spec, env)
    assert again.returncode == 0 and "already exported" in again.stdout
    gone = _run_init(spec, {**env, "DEEPSPEC_TARGET": str(tmp_path / "no-such-target")})
    assert gone.returncode != 0 and "no-such-target" in gone.stderr


# --- the rendered pod: probes, drain, ports, security ------------------------------------------------------------


@pytest.mark.parametrize("name", RUNTIME_PROFILES)
def test_probes_use_the_engines_health_endpoint_and_the_startup_budget(name):
    """GET /health on every engine: vllm-project/vllm vllm/entrypoints/serve/instrumentator/health.py `health`
    (503 once the engine core died; nothing listens before it is up), sgl-project/sglang
    python/sglang/srt/entrypoints/http_server.py `health_generate` (503 while starting and after SIGTERM),
    NVIDIA/TensorRT-LLM tensorrt_llm/serve/openai_server.py `OpenAIServer.health` (503 when the executor is gone).
    Liveness is a TCP connect: SGLang's /health runs a generation."""
    values = {**VALUE_SETS[name], "worker": {**VALUE_SETS[name]["worker"], "startupBudgetSeconds": 1201}}
    _, spec, _ = _pod(values)
    worker = container(spec, "worker")
    assert worker["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    for probe in ("startupProbe", "readinessProbe"):
        assert worker[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert worker["livenessProbe"]["tcpSocket"] == {"port": "http"}
    startup = worker["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1201


@pytest.mark.parametrize("name", RUNTIME_PROFILES)
def test_drain_fits_in_the_grace_period(name):
    """preStop sleep, then SIGTERM to the engine (exec'd, see above), which finishes in-flight requests: vLLM for
    `--shutdown-timeout` seconds (0, its default, aborts them: PR #34730 / #36666), SGLang until none is left
    (TokenizerManager `sigterm_watchdog`), trtllm-serve as uvicorn's graceful shutdown; the grace period covers the
    sleep plus worker.drainTimeoutSeconds."""
    values = {
        **VALUE_SETS[name],
        "worker": {**VALUE_SETS[name]["worker"], "drainTimeoutSeconds": 120, "preStopSleepSeconds": 20},
    }
    _, spec, _ = _pod(values)
    worker = container(spec, "worker")
    assert worker["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "20"]
    assert spec["terminationGracePeriodSeconds"] == 20 + 120 + 15
    if values["worker"]["runtime"] == "vllm":
        assert "--shutdown-timeout=120" in worker["args"]


@pytest.mark.parametrize("name", RUNTIME_PROFILES)
def test_engine_pods_get_gpus_shm_and_a_user_name(name):
    _, spec, _ = _pod(VALUE_SETS[name])
    worker = container(spec, "worker")
    gpus = VALUE_SETS[name]["worker"].get("gpu", {}).get("count", 1)
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == gpus
    assert {"name": "shm", "mountPath": "/dev/shm"} in worker["volumeMounts"]
    env = {e["name"]: e.get("value") for e in worker["env"]}
    # UID 10001 has no passwd entry in the engine images; getpass.getuser() reads $USER before the lookup
    assert env["USER"] and env["HOME"] == "/cache"
    assert {"name": "bundles", "mountPath": "/bundles", "readOnly": True} in worker["volumeMounts"]


@pytest.mark.parametrize("name", RUNTIME_PROFILES)
def test_gateway_speaks_openai_http_to_the_engine_port(name):
    docs = render(VALUE_SETS[name])
    args = container(workload(docs, "gateway")["spec"]["template"]["spec"], "gateway")["args"]
    assert "--worker-protocol=openai-http" in args
    [workers] = [a.split("=", 1)[1] for a in args if a.startswith("--workers=")]
    assert (
        workers.endswith(":http") if VALUE_SETS[name].get("gateway", {}).get("discovery") else workers.endswith(":8000")
    )
    svc = one(docs, "Service", "worker")
    assert {(p["name"], p["port"], p["targetPort"]) for p in svc["spec"]["ports"]} == {
        ("http", 8000, "http"),
        ("metrics", 8002, "http"),
    }
    policy = one(docs, "NetworkPolicy", "worker")
    assert [r["ports"] for r in policy["spec"]["ingress"]] == [[{"port": "http", "protocol": "TCP"}]] * 2
    assert not any(
        "--worker-protocol" in a
        for a in container(workload(render(), "gateway")["spec"]["template"]["spec"], "gateway")["args"]
    )


def test_the_gateway_settings_accept_the_rendered_worker_address():
    """The gateway's own settings model parses what the chart passes (service/gateway/settings.py)."""
    from service.gateway.settings import GatewaySettings

    args = container(workload(render(VALUE_SETS["vllm"]), "gateway")["spec"]["template"]["spec"], "gateway")["args"]
    flags = dict(a.removeprefix("--").split("=", 1) for a in args if a.startswith(("--workers=", "--worker-protocol=")))
    settings = GatewaySettings(workers=flags["workers"], worker_protocol=flags["worker-protocol"])
    assert settings.discovery == "dns" and settings.worker_protocol == "openai-http"


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"worker": {"runtime": "vllm"}}, "worker.bundles.source to export"),
        ({"worker": {"runtime": "sglang", "device": "cpu", "bundles": {"source": "export"}}}, "worker.device=cuda"),
        (
            {
                "worker": {
                    "runtime": "vllm",
                    "bundles": {"source": "export"},
                    "openai": {"tensorParallel": 4},
                    "gpu": {"count": 2},
                }
            },
            "raise worker.gpu.count (2) to 4",
        ),
        (
            {"worker": {"runtime": "trtllm-serve", "bundles": {"source": "export", "export": {"format": "vllm"}}}},
            "runs the launch script of --format tensorrt-llm",
        ),
    ],
)
def test_impossible_engine_runtimes_fail_with_the_setting_to_change(bad, message):
    with pytest.raises(HelmError) as info:
        render_files(bad)
    assert message in str(info.value)


def test_the_deepspec_worker_keeps_its_grpc_ports():
    docs = render()
    assert {(p["name"], p["targetPort"]) for p in one(docs, "Service", "worker")["spec"]["ports"]} == {
        ("grpc", "grpc"),
        ("metrics", "metrics"),
    }
    [endpoint] = one(render(VALUE_SETS["gpu"]), "ServiceMonitor", "worker")["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"


def test_scrape_annotations_point_at_the_engines_metrics():
    """Without the Prometheus Operator the pod annotations are the scrape path: the engine's HTTP port and its
    metrics path (trtllm-serve's Prometheus text is under /prometheus/metrics)."""
    values = {"worker": {"runtime": "trtllm-serve", "bundles": {"source": "export"}}}
    annotations = workload(render(values), "worker")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "8000" and annotations["prometheus.io/path"] == "/prometheus/metrics"
