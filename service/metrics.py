"""Every Prometheus metric name DeepSpec exports, in one place.

Names follow vLLM's where one exists, with the `deepspec:` prefix. The Grafana dashboards and alert rules in
`helm/deepspec` use exactly these names (a test checks it). Labels: `model` everywhere; `worker` on the
gateway's copies. Useful PromQL:

    mean acceptance length = 1 + rate(deepspec:spec_decode_num_accepted_tokens_total[5m])
                               / rate(deepspec:spec_decode_num_drafts_total[5m])
    acceptance rate        = rate(deepspec:spec_decode_num_accepted_tokens_total[5m])
                               / rate(deepspec:spec_decode_num_draft_tokens_total[5m])
    p99 TTFT               = histogram_quantile(0.99, sum by (le) (rate(deepspec:time_to_first_token_seconds_bucket[5m])))
"""

# Latency histograms (seconds).
TIME_TO_FIRST_TOKEN_SECONDS = "deepspec:time_to_first_token_seconds"
INTER_TOKEN_LATENCY_SECONDS = "deepspec:inter_token_latency_seconds"  # between streamed chunks
TIME_PER_OUTPUT_TOKEN_SECONDS = "deepspec:time_per_output_token_seconds"  # per request: (e2e - ttft) / (n - 1)
E2E_REQUEST_LATENCY_SECONDS = "deepspec:e2e_request_latency_seconds"
REQUEST_QUEUE_TIME_SECONDS = "deepspec:request_queue_time_seconds"

# Scheduler state gauges (vLLM meaning: running = in the batch, waiting = queued for a slot).
NUM_REQUESTS_RUNNING = "deepspec:num_requests_running"
NUM_REQUESTS_WAITING = "deepspec:num_requests_waiting"

# Token counters.
PROMPT_TOKENS_TOTAL = "deepspec:prompt_tokens_total"
GENERATION_TOKENS_TOTAL = "deepspec:generation_tokens_total"

# Request outcomes, label `status` (finish reason or error kind).
REQUEST_SUCCESS_TOTAL = "deepspec:request_success_total"

# Speculative decoding.
SPEC_DECODE_NUM_DRAFTS_TOTAL = "deepspec:spec_decode_num_drafts_total"
SPEC_DECODE_NUM_DRAFT_TOKENS_TOTAL = "deepspec:spec_decode_num_draft_tokens_total"
SPEC_DECODE_NUM_ACCEPTED_TOKENS_TOTAL = "deepspec:spec_decode_num_accepted_tokens_total"
SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS_TOTAL = "deepspec:spec_decode_num_accepted_tokens_per_pos_total"  # label `position`
SPEC_DECODE_ACCEPTANCE_LENGTH = "deepspec:spec_decode_acceptance_length"  # histogram, bonus token included

ALL_METRIC_NAMES = tuple(v for k, v in dict(globals()).items() if k.isupper() and isinstance(v, str) and v.startswith("deepspec:"))
