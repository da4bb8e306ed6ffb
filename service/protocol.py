"""The worker protocol: KServe v2 (Triton) tensor names, parameters and error codes shared by worker and gateway.

Contract only, no behaviour. Inputs and outputs use the tensor names of Triton's TensorRT-LLM ensemble, so a stock
Triton server can stand in for our worker; the `EXTRA_*` names are DeepSpec additions a stock server ignores or
does not send (the gateway then falls back as noted).

Streaming (`ModelStreamInfer`, decoupled): one response per engine step. `text_output` holds the *new* text of that
step; the count outputs are *cumulative* for the request so far, so the last response carries the usage. The last
response has the parameter `triton_final_response = true` and the output `finish_reason`.

Errors: `ModelInfer` fails with a gRPC status; a stream reports `error_message = "<STATUS>: <message>"`, where
STATUS is a `grpc.StatusCode` name (`INVALID_ARGUMENT`, `RESOURCE_EXHAUSTED`, `UNAVAILABLE`, `INTERNAL`), so the
gateway can tell bad input (400) from a full queue (retry elsewhere / 429). A message without a known prefix is
treated as `INTERNAL`.
"""

from __future__ import annotations

# Inputs (Triton TensorRT-LLM ensemble names), shape [1, 1] except stop_words [1, n].
TEXT_INPUT = "text_input"  # BYTES, UTF-8 prompt text (rendered; may be empty when EXTRA_MESSAGES_JSON is sent)
MAX_TOKENS = "max_tokens"  # INT32
STREAM = "stream"  # BOOL
TEMPERATURE = "temperature"  # FP32
TOP_K = "top_k"  # INT32
TOP_P = "top_p"  # FP32
SEED = "seed"  # UINT64
STOP_WORDS = "stop_words"  # BYTES [1, n]
END_ID = "end_id"  # INT32, an extra token id that ends generation
# DeepSpec additions.
EXTRA_MESSAGES_JSON = "messages_json"  # BYTES, a JSON list of {"role","content"}: the worker applies the chat template
EXTRA_IGNORE_EOS = "ignore_eos"  # BOOL

# Outputs.
TEXT_OUTPUT = "text_output"  # BYTES: new text (stream) or the whole completion (ModelInfer)
NUM_DRAFT_TOKENS = "num_draft_tokens"  # INT32, cumulative
NUM_ACCEPTED_TOKENS = "num_accepted_tokens"  # INT32, cumulative
EXTRA_NUM_PROMPT_TOKENS = "num_prompt_tokens"  # INT32, exact prompt length after tokenization / chat template
EXTRA_NUM_OUTPUT_TOKENS = "num_output_tokens"  # INT32, cumulative generated tokens
EXTRA_NUM_SPEC_STEPS = "num_spec_steps"  # INT32, cumulative verify rounds that had drafts
EXTRA_FINISH_REASON = "finish_reason"  # BYTES, on the final response: "stop" | "length" | "abort"

#: response parameter that flags the last response of a decoupled stream (Triton's name)
FINAL_RESPONSE_PARAM = "triton_final_response"

#: ModelConfig parameter carrying the engine's context length (prompt + max_tokens must fit)
MAX_SEQ_LEN_PARAM = "max_seq_len"
#: ModelConfig parameter naming the drafter ("none" without one)
DRAFTER_PARAM = "drafter"

STATUS_PREFIXES = ("INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED", "UNAVAILABLE", "INTERNAL", "CANCELLED")


def encode_stream_error(status: str, message: str) -> str:
    assert status in STATUS_PREFIXES, status
    return f"{status}: {message}"


def decode_stream_error(error_message: str) -> tuple[str, str]:
    """Split `"<STATUS>: msg"` into (status, msg); unknown prefixes (a stock Triton) become INTERNAL."""
    head, sep, rest = error_message.partition(": ")
    if sep and head in STATUS_PREFIXES:
        return head, rest
    return "INTERNAL", error_message
