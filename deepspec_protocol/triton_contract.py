"""The Triton contract: tensor names, datatypes and dims of the models a gateway talks to on the Triton runtime.

Contract only, no behaviour, no imports beyond the standard library: `export/formats/triton_repo.py` writes the
config.pbtxt files from these tables, `service/gateway/worker_client.py` builds its requests from them, and the
exporter copies this file next to the LLM-API model's `model.py`, which reads its inputs by the same names.

Two stock models of TensorRT-LLM's Triton backend, one dialect each:

- the LLM-API model (`tensorrt_llm`, Python backend, `max_batch_size: 0`): `text_input` [-1], `streaming`, the
  sampling parameters as `sampling_param_<name>`, request flags `sampling_param_return_perf_metrics` and
  `return_finish_reason`; the speculative-decoding counters come back as `acceptance_rate`,
  `total_accepted_draft_tokens`, `total_draft_tokens`.
- the <= 1.2 ensemble (`ensemble`, `max_batch_size` > 0, so every tensor gets a leading batch dimension of 1):
  `text_input`, `max_tokens`, `stream`, `temperature`, `top_k`, `top_p`, `seed`, `stop_words`, `end_id`, the flags
  `return_perf_metrics`, `return_num_input_tokens`, `return_num_output_tokens`; outputs as above plus
  `num_input_tokens` and `num_output_tokens`. DeepSpec's own worker speaks this dialect too.

DeepSpec additions are optional inputs and extra outputs a stock model simply does not declare: `messages_json`
(chat messages the model renders with its chat template), `ignore_eos`, and the token-id prompt (`input_ids`),
logprobs (`return_log_probs`, `top_logprobs`, `prompt_logprobs`, `logprobs_mode`), structured-output
(`structured_output`), speculation (`max_draft_tokens`), service-class (`service_class`) and several-sequences
(`num_return_sequences`, TensorRT-LLM's name) inputs only DeepSpec's
worker reads (a model without the last gets n requests of one sequence each from the gateway); the LLM-API model we
export also sends `num_input_tokens` / `num_output_tokens` (the ensemble's names) so usage is exact, and reads
`return_log_probs` / `top_logprobs`, answering the generated tokens' scores in the worker's tensors
(`SCORE_OUTPUTS`). A gateway only sends an input the model's config declares; a request that needs an undeclared one
is refused with a clear message.

Streaming: in DeepSpec's models (the exported LLM-API model, the ensemble, DeepSpec's worker) `text_output` carries
the new text of each response (a delta), every count is cumulative, and the last response carries `finish_reason`.
The stock LLM-API model sends each response's whole text so far (TensorRT-LLM's `CompletionOutput.text`): the
exported one says it sends deltas with the config parameter `TEXT_OUTPUT_MODE` = "delta", and a gateway turns the
text of an LLM-API model without it into deltas itself.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorSpec:
    """One input or output as config.pbtxt declares it."""

    name: str
    #: KServe v2 datatype (BYTES, BOOL, INT32, INT64, UINT64, FP32); config.pbtxt writes it as TYPE_<...>
    datatype: str
    #: per request, without the batch dimension; -1 = any length
    dims: tuple[int, ...] = (1,)
    optional: bool = True


#: KServe v2 datatype -> config.pbtxt data_type
CONFIG_DATATYPE = {
    "BYTES": "TYPE_STRING",
    "BOOL": "TYPE_BOOL",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "UINT64": "TYPE_UINT64",
    "FP32": "TYPE_FP32",
}

#: what a gateway request asks for -> the input carrying it, per dialect (None: the dialect has no such input)
ROLES = (
    "prompt",
    "messages",
    "max_tokens",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "end_id",
    "ignore_eos",
    "prompt_token_ids",
    "return_log_probs",
    "top_logprobs",
    "prompt_logprobs",
    "logprobs_mode",
    "structured_output",
    "num_return_sequences",
    "max_draft_tokens",
    "service_class",
    "memory_session",
)
#: roles DeepSpec's worker reads and neither stock model does (the ensemble declares `return_log_probs` but sends
#: only numbers, no token texts to render them with; the exported LLM-API model reads the logprobs ones): a model
#: that lacks one cannot serve the feature, which a gateway then refuses by name (`signature.py`)
FEATURE_OF_ROLE = {
    "prompt_token_ids": "token-id prompts",
    "return_log_probs": "logprobs",
    "top_logprobs": "logprobs",
    "prompt_logprobs": "prompt logprobs (echo)",
    "logprobs_mode": "processed logprobs (logprobs_mode)",
    "structured_output": "structured outputs",
    "max_draft_tokens": "per-request speculation control (speculation)",
}
#: roles that only inform the model (the row's service class): sent when declared, skipped silently when not
ADVISORY = ("service_class", "memory_session")
#: request flags that only ask for outputs: sent when declared, skipped silently when not
FLAGS = ("return_perf_metrics", "return_finish_reason", "return_num_input_tokens", "return_num_output_tokens")

LLMAPI_NAMES = {
    "prompt": "text_input",
    "messages": "messages_json",
    "max_tokens": "sampling_param_max_tokens",
    "stream": "streaming",
    "temperature": "sampling_param_temperature",
    "top_p": "sampling_param_top_p",
    "top_k": "sampling_param_top_k",
    "seed": "sampling_param_seed",
    "stop": "sampling_param_stop",
    "end_id": None,
    "ignore_eos": "ignore_eos",
    "prompt_token_ids": None,
    "return_log_probs": "return_log_probs",
    "top_logprobs": "top_logprobs",
    "prompt_logprobs": None,
    "logprobs_mode": None,
    "structured_output": None,
    "num_return_sequences": None,
    "max_draft_tokens": None,
    "service_class": None,
    "memory_session": None,
    "return_perf_metrics": "sampling_param_return_perf_metrics",
    "return_finish_reason": "return_finish_reason",
    "return_num_input_tokens": None,
    "return_num_output_tokens": None,
}
ENSEMBLE_NAMES = {
    "prompt": "text_input",
    "messages": "messages_json",
    "max_tokens": "max_tokens",
    "stream": "stream",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "seed": "seed",
    "stop": "stop_words",
    "end_id": "end_id",
    "ignore_eos": "ignore_eos",
    "prompt_token_ids": "input_ids",
    "return_log_probs": "return_log_probs",
    "top_logprobs": "top_logprobs",
    "prompt_logprobs": "prompt_logprobs",
    "logprobs_mode": "logprobs_mode",
    "structured_output": "structured_output",
    "num_return_sequences": "num_return_sequences",
    "max_draft_tokens": "max_draft_tokens",
    "service_class": "service_class",
    "memory_session": "session",
    "return_perf_metrics": "return_perf_metrics",
    "return_finish_reason": None,
    "return_num_input_tokens": "return_num_input_tokens",
    "return_num_output_tokens": "return_num_output_tokens",
}
#: the input only the LLM-API dialect declares: how a gateway tells the two apart from a model's config
LLMAPI_MARKER = LLMAPI_NAMES["max_tokens"]

#: roles whose tensor holds a list (BYTES [-1]); every other role is one value
LIST_ROLES = ("stop", "prompt_token_ids")
ROLE_DATATYPES = {
    "prompt": "BYTES",
    "messages": "BYTES",
    "max_tokens": "INT32",
    "stream": "BOOL",
    "temperature": "FP32",
    "top_p": "FP32",
    "top_k": "INT32",
    "seed": "UINT64",
    "stop": "BYTES",
    "end_id": "INT32",
    "ignore_eos": "BOOL",
    "prompt_token_ids": "INT32",
    "return_log_probs": "BOOL",
    "top_logprobs": "INT32",
    "prompt_logprobs": "INT32",
    "logprobs_mode": "BYTES",
    "structured_output": "BYTES",
    "num_return_sequences": "INT32",
    "max_draft_tokens": "INT32",
    "service_class": "BYTES",
    "memory_session": "BYTES",
    "return_perf_metrics": "BOOL",
    "return_finish_reason": "BOOL",
    "return_num_input_tokens": "BOOL",
    "return_num_output_tokens": "BOOL",
}

# Outputs (both dialects).
TEXT_OUTPUT = "text_output"  # BYTES: new text (stream) or the whole completion
FINISH_REASON = "finish_reason"  # BYTES: "" until a sequence's last response, then one of FINISH_REASONS
#: why a sequence ended, the one set of values on the wire (and the gateway's `status` metric label): EOS or a stop
#: string, max_tokens or a full context, a request cancelled or failed mid-way. DeepSpec's worker and the exported
#: LLM-API model send these; a stock TensorRT-LLM model may also send its own "cancelled" or "timeout"
FINISH_REASONS = ("stop", "length", "abort")
#: TensorRT-LLM's `CompletionOutput.finish_reason` values (tensorrt_llm/executor/result.py) as FINISH_REASONS: the
#: exported LLM-API model translates with this table
TRTLLM_FINISH_REASONS = {"stop": "stop", "length": "length", "cancelled": "abort", "timeout": "abort"}
ACCEPTANCE_RATE = "acceptance_rate"  # FP32
TOTAL_ACCEPTED_DRAFT_TOKENS = "total_accepted_draft_tokens"  # INT32, cumulative
TOTAL_DRAFT_TOKENS = "total_draft_tokens"  # INT32, cumulative
NUM_INPUT_TOKENS = "num_input_tokens"  # INT32: the prompt's tokens after the chat template
NUM_OUTPUT_TOKENS = "num_output_tokens"  # INT32, cumulative

#: config.pbtxt parameter of a model whose streamed `text_output` is a delta (value TEXT_DELTA); an LLM-API model
#: without it streams cumulative text
TEXT_OUTPUT_MODE = "deepspec_text_output"
TEXT_DELTA = "delta"

#: the LLM-API model's only stop input that is not a sampling parameter: `stop: true` cancels the request id
STOP_REQUEST = "stop"


def _inputs(
    names: dict[str, str | None], required: tuple[str, ...], prompt_dims: tuple[int, ...]
) -> tuple[TensorSpec, ...]:
    """The inputs a dialect declares: one per role it names, lists [-1], scalars [1]."""
    return tuple(
        TensorSpec(
            name,
            ROLE_DATATYPES[role],
            (-1,) if role in LIST_ROLES else prompt_dims if role == "prompt" else (1,),
            optional=role not in required,
        )
        for role, name in names.items()
        if name is not None
    )


#: the generated tokens' scores, one row per token, as DeepSpec's worker sends them (deepspec_protocol/worker.py
#: OUTPUT_SCORES and ScoreTensors, mirrored: this file imports nothing): the log_probs, token_ids and tokens columns
#: [n], the likeliest alternatives' [n, k], sent only when the request asked for some
SCORE_OUTPUTS = (
    TensorSpec("output_log_probs", "FP32", (-1,)),
    TensorSpec("output_token_ids", "INT32", (-1,)),
    TensorSpec("output_tokens", "BYTES", (-1,)),
    TensorSpec("output_top_log_probs", "FP32", (-1, -1)),
    TensorSpec("output_top_token_ids", "INT32", (-1, -1)),
    TensorSpec("output_top_tokens", "BYTES", (-1, -1)),
)

#: the LLM-API model's inputs: upstream's names and dims (text_input [-1]), our `messages_json`, `ignore_eos` and
#: logprobs (`return_log_probs`, `top_logprobs`)
LLMAPI_INPUTS = _inputs(LLMAPI_NAMES, ("prompt",), (-1,)) + (TensorSpec(STOP_REQUEST, "BOOL"),)
LLMAPI_OUTPUTS = (
    TensorSpec(TEXT_OUTPUT, "BYTES", (-1,)),
    TensorSpec(FINISH_REASON, "BYTES", (-1,)),
    TensorSpec(ACCEPTANCE_RATE, "FP32"),
    TensorSpec(TOTAL_ACCEPTED_DRAFT_TOKENS, "INT32"),
    TensorSpec(TOTAL_DRAFT_TOKENS, "INT32"),
    TensorSpec(NUM_INPUT_TOKENS, "INT32"),
    TensorSpec(NUM_OUTPUT_TOKENS, "INT32"),
    *SCORE_OUTPUTS,
)

#: the ensemble's inputs a gateway may send, as upstream's ensemble declares them (text_input and max_tokens
#: required); DeepSpec's additions are left out: the ensemble's preprocessing model is upstream's and reads none of
#: them (nor does it turn `return_log_probs` into token texts), and so is `num_return_sequences`, which the exported
#: ensemble does not wire to its engine (a gateway asks it for n sequences as n requests instead)
_NOT_IN_UPSTREAM_ENSEMBLE = ("messages", "ignore_eos", "num_return_sequences", *FEATURE_OF_ROLE, *ADVISORY)
ENSEMBLE_INPUTS = _inputs(
    {role: name for role, name in ENSEMBLE_NAMES.items() if role not in _NOT_IN_UPSTREAM_ENSEMBLE},
    ("prompt", "max_tokens"),
    (1,),
)
ENSEMBLE_OUTPUTS = (
    TensorSpec(TEXT_OUTPUT, "BYTES", (-1,)),
    TensorSpec(ACCEPTANCE_RATE, "FP32"),
    TensorSpec(TOTAL_ACCEPTED_DRAFT_TOKENS, "INT32"),
    TensorSpec(TOTAL_DRAFT_TOKENS, "INT32"),
    TensorSpec(NUM_INPUT_TOKENS, "INT32"),
    TensorSpec(NUM_OUTPUT_TOKENS, "INT32"),
)
