"""Which metric of each serving engine answers each question the dashboards, alerts and autoscaler ask.

One table, `RUNTIMES`: `worker.runtime` -> signal -> the engine's own series. Everything per-runtime is generated from
it: the recording rules that copy each engine's series into one `deepspec_engine:` vocabulary (so the dashboards
carry one set of queries whatever runtime runs), the autoscaler's queue and batch triggers, and the queue alert.

Why recording rules rather than one dashboard per runtime: the engines disagree on more than names (vLLM labels the
model `model_name`, SGLang exports its acceptance only as a gauge, TensorRT-LLM counts drafts only per position), and
a rule is where such a difference can be bridged once, tested with `promtool test rules`, and reused by alerts and
panels alike. The cost: the engine panels need the chart's PrometheusRule (Prometheus Operator); KEDA's triggers
read the engines' own series directly, so autoscaling does not depend on it.

Signals a runtime cannot provide are absent from its entry, with the reason in `MISSING`; nothing is guessed. Every
name below was read in the engine's source (the file and function are in each `Source.cite`).

    python helm/tools/engine_metrics.py            # rewrite helm/deepspec/monitoring/engines.yaml and the
                                                   # chart README's table (between the engine-metrics markers)
    python helm/tools/engine_metrics.py --check    # exit 1 when it is stale (tests run this)
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling module, whether run or loaded by path
from regenerate import regenerate

OUT_PATH = Path(__file__).resolve().parents[1] / "deepspec" / "monitoring" / "engines.yaml"
README = Path(__file__).resolve().parents[1] / "deepspec" / "README.md"
BEGIN, END = "<!-- engine-metrics:begin -->", "<!-- engine-metrics:end -->"
PREFIX = "deepspec_engine:"
#: placeholders the chart's templates replace with a scrape job's selector (`job="…", namespace="…"`): the workers',
#: the gateways', and both (the copies this release's rules recorded)
WORKER, GATEWAY, OWN = "@worker@", "@gateway@", "@own@"
#: the window of the rate-derived recordings (acceptance rate, mean acceptance length, tokens per forward)
WINDOW = "5m"


@dataclasses.dataclass(frozen=True)
class Source:
    """One engine series. `matchers` narrow it (a label of a multi-signal family); `job` says whose `/metrics`
    serves it; `model_label` holds the served model's name there; `status_label` the request outcome, if any."""

    metric: str
    cite: str
    matchers: str = ""
    job: str = "worker"
    model_label: str = "model"
    status_label: str = ""

    def selector(self) -> str:
        where = WORKER if self.job == "worker" else GATEWAY
        return f"{self.metric}{{{where}{', ' + self.matchers if self.matchers else ''}}}"


#: normalised signal -> (kind, what it means). Histograms are in seconds; the copies keep the engine's buckets.
SIGNALS = {
    "num_requests_waiting": ("gauge", "requests queued for a batch slot"),
    "num_requests_running": ("gauge", "requests in the running batch"),
    "time_to_first_token_seconds": ("histogram", "request arrival to its first output token"),
    "time_per_output_token_seconds": ("histogram", "decode time per output token after the first"),
    "e2e_request_latency_seconds": ("histogram", "request arrival to its last token"),
    "request_success_total": ("counter", "finished requests, label `status`"),
    "spec_decode_num_draft_tokens_total": ("counter", "draft tokens proposed"),
    "spec_decode_num_accepted_tokens_total": ("counter", "draft tokens the target accepted"),
    "spec_decode_num_drafts_total": ("counter", "drafts verified (verify rounds with a draft)"),
    "spec_decode_num_forwards_total": ("counter", "decode rounds (target passes) of requests, drafted or not"),
    "spec_decode_num_forward_tokens_total": ("counter", "tokens those rounds committed: accepted drafts + 1 each"),
    "spec_decode_acceptance_rate": ("gauge", "the engine's own running acceptance ratio (no counters)"),
    "spec_decode_acceptance_length": ("gauge", "the engine's own mean tokens per verify round (no counters)"),
}

_DS = "service/metrics.py (the worker's own WorkerMetrics)"
_GW = "service/metrics.py GatewayMetrics: the gateway's per-request copies, from Triton's response outputs"
_VLLM = "vllm-project/vllm vllm/v1/metrics/loggers.py PrometheusStatLogger.__init__"
_VLLM_SD = "vllm-project/vllm vllm/v1/spec_decode/metrics.py SpecDecodingProm.__init__"
_SGL_SCHED = "sgl-project/sglang python/sglang/srt/metrics/collector.py SchedulerMetricsCollector.__init__"
_SGL_TOK = "sgl-project/sglang python/sglang/srt/metrics/collector.py TokenizerMetricsCollector.__init__"
_TRT = "NVIDIA/TensorRT-LLM tensorrt_llm/metrics/collector.py MetricsCollector.__init__"
_LLMAPI = (
    "export/triton/llmapi_model.py RequestGauges: the exported LLM-API model's own gauges (Triton's pending "
    "count stays near 0 for a decoupled Python model; nv_trt_llm_* come only from the C++ tensorrtllm backend)"
)
_GW_OUTSTANDING = (
    "service/metrics.py GatewayMetrics.num_requests_outstanding: requests the gateway sent to the "
    "worker and not finished (running plus queued), for an engine release without a queue gauge"
)

RUNTIMES: dict[str, dict[str, Source]] = {
    "deepspec": {
        "num_requests_waiting": Source("deepspec:num_requests_waiting", _DS),
        "num_requests_running": Source("deepspec:num_requests_running", _DS),
        "time_to_first_token_seconds": Source("deepspec:time_to_first_token_seconds", _DS),
        "time_per_output_token_seconds": Source("deepspec:time_per_output_token_seconds", _DS),
        "e2e_request_latency_seconds": Source("deepspec:e2e_request_latency_seconds", _DS),
        "request_success_total": Source("deepspec:request_success_total", _DS, status_label="status"),
        "spec_decode_num_draft_tokens_total": Source("deepspec:spec_decode_num_draft_tokens_total", _DS),
        "spec_decode_num_accepted_tokens_total": Source("deepspec:spec_decode_num_accepted_tokens_total", _DS),
        "spec_decode_num_drafts_total": Source("deepspec:spec_decode_num_drafts_total", _DS),
        "spec_decode_num_forwards_total": Source("deepspec:spec_decode_num_forwards_total", _DS),
        "spec_decode_num_forward_tokens_total": Source("deepspec:spec_decode_num_forward_tokens_total", _DS),
    },
    "triton": {
        "num_requests_waiting": Source("deepspec_llmapi_num_requests_waiting", _LLMAPI),
        "num_requests_running": Source("deepspec_llmapi_num_requests_running", _LLMAPI),
        "time_to_first_token_seconds": Source("deepspec:time_to_first_token_seconds", _GW, job="gateway"),
        "time_per_output_token_seconds": Source("deepspec:time_per_output_token_seconds", _GW, job="gateway"),
        "e2e_request_latency_seconds": Source("deepspec:e2e_request_latency_seconds", _GW, job="gateway"),
        "request_success_total": Source("deepspec:request_success_total", _GW, job="gateway", status_label="status"),
        "spec_decode_num_draft_tokens_total": Source("deepspec:spec_decode_num_draft_tokens_total", _GW, job="gateway"),
        "spec_decode_num_accepted_tokens_total": Source(
            "deepspec:spec_decode_num_accepted_tokens_total", _GW, job="gateway"
        ),
        "spec_decode_num_drafts_total": Source("deepspec:spec_decode_num_drafts_total", _GW, job="gateway"),
    },
    "vllm": {
        "num_requests_waiting": Source("vllm:num_requests_waiting", _VLLM, model_label="model_name"),
        "num_requests_running": Source("vllm:num_requests_running", _VLLM, model_label="model_name"),
        "time_to_first_token_seconds": Source("vllm:time_to_first_token_seconds", _VLLM, model_label="model_name"),
        # per request, as DeepSpec's and TensorRT-LLM's. vLLM's inter_token_latency_seconds is one observation per
        # engine output (vllm/v1/metrics/stats.py IterationStats.update_from_output), several tokens under speculation
        "time_per_output_token_seconds": Source(
            "vllm:request_time_per_output_token_seconds", _VLLM, model_label="model_name"
        ),
        "e2e_request_latency_seconds": Source("vllm:e2e_request_latency_seconds", _VLLM, model_label="model_name"),
        "request_success_total": Source(
            "vllm:request_success_total", _VLLM, model_label="model_name", status_label="finished_reason"
        ),
        "spec_decode_num_draft_tokens_total": Source(
            "vllm:spec_decode_num_draft_tokens_total", _VLLM_SD, model_label="model_name"
        ),
        "spec_decode_num_accepted_tokens_total": Source(
            "vllm:spec_decode_num_accepted_tokens_total", _VLLM_SD, model_label="model_name"
        ),
        "spec_decode_num_drafts_total": Source("vllm:spec_decode_num_drafts_total", _VLLM_SD, model_label="model_name"),
    },
    "sglang": {
        "num_requests_waiting": Source("sglang:num_queue_reqs", _SGL_SCHED, model_label="model_name"),
        "num_requests_running": Source("sglang:num_running_reqs", _SGL_SCHED, model_label="model_name"),
        "time_to_first_token_seconds": Source("sglang:time_to_first_token_seconds", _SGL_TOK, model_label="model_name"),
        # observe_inter_token_latency spreads each interval over the tokens it produced: a per-token time
        "time_per_output_token_seconds": Source(
            "sglang:inter_token_latency_seconds", _SGL_TOK, model_label="model_name"
        ),
        "e2e_request_latency_seconds": Source("sglang:e2e_request_latency_seconds", _SGL_TOK, model_label="model_name"),
        "request_success_total": Source("sglang:num_requests_total", _SGL_TOK, model_label="model_name"),
        "spec_decode_acceptance_rate": Source("sglang:spec_accept_rate", _SGL_SCHED, model_label="model_name"),
        "spec_decode_acceptance_length": Source("sglang:spec_accept_length", _SGL_SCHED, model_label="model_name"),
    },
    "trtllm-serve": {
        # 1.2.1 has no queue gauge (helm/tools/engine_series.py): the gateway's count of what it sent stands in
        "num_requests_running": Source("deepspec:gateway_num_requests_outstanding", _GW_OUTSTANDING, job="gateway"),
        # per-request stats (`return_perf_metrics: true`)
        "time_to_first_token_seconds": Source("trtllm_time_to_first_token_seconds", _TRT, model_label="model_name"),
        "time_per_output_token_seconds": Source("trtllm_time_per_output_token_seconds", _TRT, model_label="model_name"),
        "e2e_request_latency_seconds": Source("trtllm_e2e_request_latency_seconds", _TRT, model_label="model_name"),
        "request_success_total": Source(
            "trtllm_request_success_total", _TRT, model_label="model_name", status_label="finished_reason"
        ),
    },
}

#: why a runtime lacks a signal (read in its source, not assumed)
MISSING = {
    ("sglang", "spec_decode_num_draft_tokens_total"): "collector.py exports acceptance only as the gauges "
    "spec_accept_rate / spec_accept_length",
    ("sglang", "spec_decode_num_accepted_tokens_total"): "as above",
    ("sglang", "spec_decode_num_drafts_total"): "as above",
    ("trtllm-serve", "num_requests_waiting"): "1.2.1's collector.py has no queue gauge (added after 1.2); the "
    "gateway's outstanding requests drive the batch trigger instead",
    ("trtllm-serve", "spec_decode_num_draft_tokens_total"): "1.2.1's collector.py has no speculative-decoding series "
    "(added after 1.2)",
    ("trtllm-serve", "spec_decode_num_accepted_tokens_total"): "as above",
    ("trtllm-serve", "spec_decode_num_drafts_total"): "as above",
    ("trtllm-serve", "spec_decode_num_forwards_total"): "as above",
    ("trtllm-serve", "spec_decode_num_forward_tokens_total"): "as above",
    ("triton", "spec_decode_num_forwards_total"): "Triton's response outputs carry the draft counts, not the "
    "target passes a request took",
    ("triton", "spec_decode_num_forward_tokens_total"): "as above",
    ("vllm", "spec_decode_num_forwards_total"): "metrics.py counts only steps that drafted (num_drafts); no "
    "per-request count of all target passes",
    ("vllm", "spec_decode_num_forward_tokens_total"): "as above",
    ("sglang", "spec_decode_num_forwards_total"): "collector.py exports acceptance only as gauges",
    ("sglang", "spec_decode_num_forward_tokens_total"): "as above",
}

#: the request outcome when an engine's counter carries none (SGLang counts finished requests only)
DEFAULT_STATUS = "finished"


def _copy(signal: str, source: Source) -> dict:
    """A recording rule that copies one engine series under its `deepspec_engine:` name, the model's name in
    `model` and the outcome in `status`. Counters and buckets stay per series, so rate() over the copy is exact."""
    kind = SIGNALS[signal][0]
    suffix = "_bucket" if kind == "histogram" else ""
    expr = source.selector().replace(source.metric, source.metric + suffix, 1)
    if source.model_label != "model":
        expr = f'label_replace({expr}, "model", "$1", "{source.model_label}", "(.*)")'
    if signal == "request_success_total":
        if source.status_label and source.status_label != "status":
            expr = f'label_replace({expr}, "status", "$1", "{source.status_label}", "(.*)")'
        elif not source.status_label:
            expr = f'label_replace({expr}, "status", "{DEFAULT_STATUS}", "__name__", ".*")'
    return {"record": PREFIX + signal + suffix, "expr": expr}


BY = "namespace, job, model"


def _rate(signal: str) -> str:
    return f"sum by ({BY}) (rate({PREFIX}{signal}{{{OWN}}}[{WINDOW}]))"


def _derived(signals: dict[str, Source]) -> list[dict]:
    """Acceptance rate and mean acceptance length per model: from the counters where the engine has them, else
    the engine's own gauge (`or`: a runtime with both answers from its counters); tokens per target forward over
    all rounds where the engine counts every pass."""
    rules = []
    rate_forms, length_forms = [], []
    if {"spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total"} <= signals.keys():
        rate_forms.append(
            f"{_rate('spec_decode_num_accepted_tokens_total')} / {_rate('spec_decode_num_draft_tokens_total')}"
        )
    if "spec_decode_acceptance_rate" in signals:
        rate_forms.append(f"avg by ({BY}) ({PREFIX}spec_decode_acceptance_rate{{{OWN}}})")
    if {"spec_decode_num_drafts_total", "spec_decode_num_accepted_tokens_total"} <= signals.keys():
        length_forms.append(
            f"1 + {_rate('spec_decode_num_accepted_tokens_total')} / {_rate('spec_decode_num_drafts_total')}"
        )
    if "spec_decode_acceptance_length" in signals:
        length_forms.append(f"avg by ({BY}) ({PREFIX}spec_decode_acceptance_length{{{OWN}}})")
    forward_forms = []
    if {"spec_decode_num_forwards_total", "spec_decode_num_forward_tokens_total"} <= signals.keys():
        forward_forms.append(
            f"{_rate('spec_decode_num_forward_tokens_total')} / {_rate('spec_decode_num_forwards_total')}"
        )
    for name, forms in (
        ("spec_decode_acceptance_rate", rate_forms),
        ("spec_decode_mean_acceptance_length", length_forms),
        ("spec_decode_tokens_per_forward", forward_forms),
    ):
        if forms:
            rules.append(
                {
                    "record": f"{PREFIX}{name}:rate{WINDOW}",
                    "expr": " or ".join(f"({f})" for f in forms) if len(forms) > 1 else forms[0],
                }
            )
    return rules


def recording_rules(runtime: str) -> list[dict]:
    """The recording rules of one runtime, with the `@worker@` / `@gateway@` / `@own@` selectors still to fill in."""
    try:
        signals = RUNTIMES[runtime]
    except KeyError:
        raise KeyError(f"unknown worker.runtime {runtime!r}; available: {sorted(RUNTIMES)}") from None
    return [_copy(signal, source) for signal, source in signals.items()] + _derived(signals)


def recorded_names() -> set[str]:
    """Every series name the recording rules of any runtime produce."""
    return {rule["record"] for runtime in RUNTIMES for rule in recording_rules(runtime)}


def table() -> dict:
    """What the chart reads (helm/deepspec/monitoring/engines.yaml): per runtime, the raw queue and batch
    selectors (KEDA, the queue alert) and the recording rules."""
    return {
        runtime: {
            "waiting": signals["num_requests_waiting"].selector() if "num_requests_waiting" in signals else None,
            "running": signals["num_requests_running"].selector(),
            "rules": recording_rules(runtime),
        }
        for runtime, signals in RUNTIMES.items()
    }


def readme_table() -> str:
    """Markdown: one row per signal, one column per runtime, each cell the engine series it is recorded from."""
    runtimes = list(RUNTIMES)
    lines = [
        "| `deepspec_engine:` series | " + " | ".join(f"`{r}`" for r in runtimes) + " |",
        "| --- |" + " --- |" * len(runtimes),
    ]
    for signal, (kind, meaning) in SIGNALS.items():
        cells = []
        for runtime in runtimes:
            source = RUNTIMES[runtime].get(signal)
            if source is None:
                cells.append(f"— ({MISSING[(runtime, signal)]})" if (runtime, signal) in MISSING else "—")
                continue
            where = " (gateway)" if source.job == "gateway" else ""
            cells.append(
                f"`{source.metric}{{{source.matchers}}}`{where}" if source.matchers else f"`{source.metric}`{where}"
            )
        lines.append(f"| `{signal}` ({kind}: {meaning}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fill_block(text: str, body: str) -> str:
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{README}: no {BEGIN} ... {END} block to fill")
    head, rest = text.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{body}\n{END}{rest.split(END, 1)[1]}"


def render() -> dict[Path, str]:
    header = "# Generated by helm/tools/engine_metrics.py from its RUNTIMES table: edit that, then rerun it.\n"
    return {
        OUT_PATH: header + yaml.safe_dump(table(), sort_keys=False, width=1000),
        README: _fill_block(README.read_text(), readme_table()),
    }


def main(argv: list[str] | None = None) -> int:
    return regenerate(render, argv, (__doc__ or "").partition("\n")[0], "helm/tools/engine_metrics.py")


if __name__ == "__main__":
    raise SystemExit(main())
