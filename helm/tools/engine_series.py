"""The Prometheus series each serving engine emits, per release: what the chart's autoscaler, alerts and recording
rules may name for a `worker.runtime` (helm/tools/engine_metrics.py), checked against the release the chart pins.

`EMITTED[runtime][version]` is read from that release's code (the file and function in `CITES`); the version keys
are the releases docker/images.py pins (`ENGINE_IMAGES` for vllm, sglang and trtllm-serve, `PINNED`'s Triton
server for triton). tests/helm/test_engine_series.py renders the chart for each runtime and fails on any query that
names a series outside its pinned release's list, so a series an engine gains only in a later release, or one a
backend the model does not use emits, never reaches an autoscaler trigger again. A new pin is a new row here first.

Standard library only (the chart's generators load it by path).
"""

from __future__ import annotations

#: Triton's own per-model and device series (triton-inference-server/core src/metrics.cc `Metrics::Metrics`,
#: r26.07), which every model gets, whatever its backend
_TRITON_CORE = frozenset(
    {
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us",
        "nv_inference_pending_request_count",
        "nv_gpu_utilization",
        "nv_gpu_memory_total_bytes",
        "nv_gpu_memory_used_bytes",
        "nv_gpu_power_usage",
        "nv_gpu_power_limit",
        "nv_energy_consumption",
        "nv_cpu_utilization",
        "nv_cpu_memory_total_bytes",
        "nv_cpu_memory_used_bytes",
    }
)
#: what the exported LLM-API model adds (export/triton/llmapi_model.py `RequestGauges`); the C++ `tensorrtllm`
#: backend's `nv_trt_llm_*` series are absent: that model does not run on it
_LLMAPI_MODEL = frozenset({"deepspec_llmapi_num_requests_waiting", "deepspec_llmapi_num_requests_running"})

#: trtllm-serve 1.2.1's `/prometheus/metrics` (tensorrt_llm/metrics/collector.py `MetricsCollector.__init__` at
#: v1.2.1: the per-request histograms and counter, and the KV-cache gauges of the iteration stats). The queue
#: gauges (`trtllm_num_requests_running` / `_waiting`) and the speculative-decoding series came after 1.2.
_TRTLLM_1_2 = frozenset(
    {
        "trtllm_request_success_total",
        "trtllm_e2e_request_latency_seconds",
        "trtllm_time_to_first_token_seconds",
        "trtllm_time_per_output_token_seconds",
        "trtllm_request_queue_time_seconds",
        "trtllm_kv_cache_hit_rate",
        "trtllm_kv_cache_reused_blocks_total",
        "trtllm_kv_cache_missed_blocks_total",
        "trtllm_kv_cache_utilization",
    }
)

#: vLLM 0.31 (vllm/v1/metrics/loggers.py `PrometheusStatLogger.__init__`, vllm/v1/spec_decode/metrics.py
#: `SpecDecodingProm.__init__`)
_VLLM_0_31 = frozenset(
    {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:request_success_total",
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
        "vllm:iteration_tokens_total",
        "vllm:request_max_num_generation_tokens",
        "vllm:request_params_n",
        "vllm:request_params_max_tokens",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:request_time_per_output_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_inference_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    }
)

#: SGLang 0.5.20 (python/sglang/srt/metrics/collector.py `SchedulerMetricsCollector.__init__`,
#: `TokenizerMetricsCollector.__init__`)
_SGLANG_0_5 = frozenset(
    {
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:num_used_tokens",
        "sglang:token_usage",
        "sglang:gen_throughput",
        "sglang:cache_hit_rate",
        "sglang:spec_accept_length",
        "sglang:spec_accept_rate",
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
        "sglang:num_requests_total",
        "sglang:time_to_first_token_seconds",
        "sglang:inter_token_latency_seconds",
        "sglang:e2e_request_latency_seconds",
    }
)

#: runtime -> release -> the series it emits (a histogram's name without `_bucket` / `_sum` / `_count`)
EMITTED: dict[str, dict[str, frozenset[str]]] = {
    "triton": {"2.71.0": _TRITON_CORE | _LLMAPI_MODEL},
    "trtllm-serve": {"1.2.1": _TRTLLM_1_2},
    "vllm": {"0.31.0": _VLLM_0_31},
    "sglang": {"0.5.20": _SGLANG_0_5},
}

_SUFFIXES = ("_bucket", "_sum", "_count")


def emits(runtime: str, version: str, series: str) -> bool:
    """Whether that release of the runtime's engine emits `series` (a histogram's sample names included)."""
    try:
        names = EMITTED[runtime][version]
    except KeyError:
        have = {r: sorted(v) for r, v in EMITTED.items()}
        raise KeyError(
            f"no series list for {runtime} {version} in helm/tools/engine_series.py (have: {have}): read "
            "that release's code and add it"
        ) from None
    base = next((series[: -len(s)] for s in _SUFFIXES if series.endswith(s) and series[: -len(s)] in names), series)
    return base in names
