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

Error codes: a refusal by the engine's validation (deepspec/decoding/validation.py `RequestErrorCode`) also carries
its code, a short string such as `context_length_exceeded`, in a structured field, never inside the message:
`ModelInfer` sends it as the trailing metadata `ERROR_CODE_METADATA`; a stream sets the parameter `ERROR_CODE_PARAM`
on the error response's `infer_response`. The gateway returns it as the OpenAI error body's `code`. Both fields are
optional: a stock Triton sends neither, and the gateway then has a status but no code. The strings are listed in
`ERROR_CODES` (the gateway image has no deepspec library; a test checks they mirror `RequestErrorCode`).

Logprobs: a request asks for them with `return_log_probs` (TensorRT-LLM's input) and `top_logprobs` (how many
alternatives per position), and for the prompt's with `prompt_logprobs`; a prompt may come as token ids in
`input_ids` (the name of TensorRT-LLM's `tensorrt_llm` model input) instead of text. Each response then carries a
table of the tokens whose text it carries (`OUTPUT_SCORES`; TensorRT-LLM's `output_log_probs` plus DeepSpec's
columns), the prompt's table once, in the first response (`PROMPT_SCORES`). The numbers are of the target's raw
distribution unless the request sets `logprobs_mode` to `processed_logprobs` (`LOGPROBS_MODES`; the one sampled
from: deepspec/decoding/logprobs.py). `deepspec_protocol/token_scores.py` writes and
reads the tables; the worker decides which tokens a response's text carries (`service/worker/token_texts.py`).

Structured outputs: a request whose output must match a constraint sends it as `structured_output`, the JSON text
`{"kind": ..., "spec": ...}` (`Constraint`): kind one of `STRUCTURED_OUTPUT_KINDS` (deepspec/decoding/structured.py
KINDS, mirrored), spec the JSON schema text, the regex, the EBNF grammar or a JSON list of the allowed strings, and
empty for json_object. The worker compiles it with the engine's grammar compiler; a value it cannot read, or a spec
that does not compile, is INVALID_ARGUMENT with the code `structured_output_invalid`.

Several choices (`n`): a request asks for n sequences from one prompt with `num_return_sequences` (TensorRT-LLM's
input; absent = 1, at most the worker's batch size). The worker prefills the prompt once and forks its KV cache into
n slots (deepspec/decoding/engine.py), so each sequence is drafted, verified and sampled on its own (a seeded
request's sequence i draws from seed + i, as vLLM's child requests do). Every response names its sequence in
`sequence_index` (TensorRT-LLM's output; absent = 0); the sequences' responses interleave on the stream, each
sequence's counts are its own and cumulative (the prompt count is the same in all), each sequence's last response
has its `finish_reason`, and `triton_final_response` is true only on the request's very last response. A
non-streaming request (`stream` false) gets one response per sequence, when it finishes; several sequences need
`ModelStreamInfer` (a unary `ModelInfer` answers one response), so ModelInfer refuses n > 1 with INVALID_ARGUMENT.

Speculation: a request may cap the draft tokens each of its verify rounds checks with `max_draft_tokens` (0 turns
speculation off for it: the target decodes alone); absent, the worker's own setting applies. Greedy output is the
same in every mode: only how many target tokens one round commits changes, never which.

Session memory: `session` names the session (a key the gateway derives from the caller's API key and the client's
session id, so two keys never share one) whose earlier answers the worker's drafters may draft from and which
remembers this answer (deepspec/decoding/session_memory.py); absent, nothing is remembered.

Service classes: `service_class` names the class the gateway admitted the request under (one of `SERVICE_CLASSES`,
a bounded set so it can label metrics); the worker keeps it on the request's record and labels its acceptance
metrics with it. A stock Triton model does not declare it and is sent none.

Load: a worker's first and last responses to each request carry its load as response parameters (`WorkerLoad`,
`LOAD_PARAM_PREFIX`): running and waiting requests, batch slots, KV utilization, the tokens a running row commits per
second and each service class's acceptance length, which the gateway scores workers by (gateway/scoring.py). A
stock Triton sends none; the gateway then routes to it by its outstanding requests alone.

Statistics: `RequestStats` is the one record of a request's counts, built by the worker's scheduler from the engine's
step outputs, written to the output tensors named in `STATS_OUTPUTS`, and read back by the gateway for usage,
metrics and the request log.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields

from deepspec_protocol import triton_contract as _contract

_NAMES = _contract.ENSEMBLE_NAMES

# Inputs: the Triton contract's ensemble names (one table, deepspec_protocol/triton_contract.py ENSEMBLE_NAMES),
# shape [1, 1] except stop_words and input_ids [1, n].
TEXT_INPUT = _NAMES["prompt"]  # BYTES, UTF-8 prompt text (rendered; may be empty when EXTRA_MESSAGES_JSON is sent)
MAX_TOKENS = _NAMES["max_tokens"]  # INT32
STREAM = _NAMES["stream"]  # BOOL
TEMPERATURE = _NAMES["temperature"]  # FP32
TOP_K = _NAMES["top_k"]  # INT32
TOP_P = _NAMES["top_p"]  # FP32
SEED = _NAMES["seed"]  # UINT64
STOP_WORDS = _NAMES["stop"]  # BYTES [1, n]
END_ID = _NAMES["end_id"]  # INT32, an extra token id that ends generation
# DeepSpec additions.
EXTRA_MESSAGES_JSON = _NAMES["messages"]  # BYTES, a JSON list of {"role","content"}: the worker renders the template
EXTRA_IGNORE_EOS = _NAMES["ignore_eos"]  # BOOL
RETURN_LOG_PROBS = _NAMES["return_log_probs"]  # BOOL, TensorRT-LLM's name: send the generated tokens' logprobs
INPUT_IDS = _NAMES["prompt_token_ids"]  # INT32 [1, n], the prompt as token ids (TensorRT-LLM's name); text_input empty
EXTRA_TOP_LOGPROBS = _NAMES["top_logprobs"]  # INT32, alternatives per generated position (0..MAX_TOP_LOGPROBS)
EXTRA_PROMPT_LOGPROBS = _NAMES["prompt_logprobs"]  # INT32, score the prompt with this many alternatives; absent = off
EXTRA_LOGPROBS_MODE = _NAMES["logprobs_mode"]  # BYTES, "raw_logprobs" (absent) or "processed_logprobs" (vLLM's names)
EXTRA_STRUCTURED_OUTPUT = _NAMES["structured_output"]  # BYTES, a Constraint's JSON: the output must match it
NUM_RETURN_SEQUENCES = _NAMES["num_return_sequences"]  # INT32, sequences from this prompt (TensorRT-LLM's name)
EXTRA_MAX_DRAFT_TOKENS = _NAMES["max_draft_tokens"]  # INT32, draft tokens verified per round at most (0 = off)
EXTRA_SERVICE_CLASS = _NAMES["service_class"]  # BYTES, the request's service class (SERVICE_CLASSES); absent = standard
EXTRA_SESSION = _NAMES["memory_session"]  # BYTES, the session key whose earlier answers may draft this request

# Outputs: text and finish reason as the Triton contract names them (its FINISH_REASONS are the values), the counts
# DeepSpec's own.
TEXT_OUTPUT = _contract.TEXT_OUTPUT  # BYTES: new text (stream) or the whole completion (ModelInfer)
NUM_DRAFT_TOKENS = "num_draft_tokens"  # INT32, cumulative
NUM_ACCEPTED_TOKENS = "num_accepted_tokens"  # INT32, cumulative
EXTRA_NUM_PROMPT_TOKENS = "num_prompt_tokens"  # INT32, exact prompt length after tokenization / chat template
EXTRA_NUM_OUTPUT_TOKENS = "num_output_tokens"  # INT32, cumulative generated tokens
EXTRA_NUM_SPEC_STEPS = "num_spec_steps"  # INT32, cumulative verify rounds that had drafts
EXTRA_FINISH_REASON = _contract.FINISH_REASON  # BYTES, on each sequence's last response: one of FINISH_REASONS
FINISH_REASONS = _contract.FINISH_REASONS
SEQUENCE_INDEX = "sequence_index"  # INT32, which of the request's sequences this response belongs to (0..n-1)


@dataclass(frozen=True)
class ScoreTensors:
    """The output tensors of one table of scored tokens, row i = token i. A token without a logprob (the prompt's
    first: nothing predicts it) has NaN. The top columns are sent only when the request asked for alternatives;
    a token without a logprob has a padding row there (NaN, -1, "")."""

    #: FP32 [1, n]
    log_probs: str
    #: INT32 [1, n]
    token_ids: str
    #: BYTES [1, n], UTF-8: the text each token adds (see service/worker/token_texts.py)
    tokens: str
    #: FP32 [n, k], likeliest first
    top_log_probs: str
    #: INT32 [n, k]
    top_token_ids: str
    #: BYTES [n, k], each alternative decoded on its own
    top_tokens: str

    def names(self) -> tuple[str, ...]:
        return tuple(getattr(self, f.name) for f in fields(self))


def _score_tensors(prefix: str) -> ScoreTensors:
    return ScoreTensors(
        *(
            f"{prefix}_{column}"
            for column in ("log_probs", "token_ids", "tokens", "top_log_probs", "top_token_ids", "top_tokens")
        )
    )


#: the generated tokens of a response; `output_log_probs` is TensorRT-LLM's name
OUTPUT_SCORES = _score_tensors("output")
#: the prompt's tokens, in the first response of a request that set prompt_logprobs
PROMPT_SCORES = _score_tensors("prompt")
#: the most alternatives per position a request may ask for (deepspec.decoding.logprobs.MAX_TOP_LOGPROBS, mirrored:
#: the gateway image has no deepspec library)
MAX_TOP_LOGPROBS = 20

#: the service classes a request may run under, most urgent first (the gateway's admission order and the `class`
#: label of the acceptance metrics: a fixed set keeps the label's cardinality bounded)
SERVICE_CLASSES = ("interactive", "standard", "batch")
DEFAULT_SERVICE_CLASS = "standard"

#: response parameters carrying a worker's load: LOAD_PARAM_PREFIX + a `WorkerLoad` field name
LOAD_PARAM_PREFIX = "deepspec_load_"


@dataclass(frozen=True)
class WorkerLoad:
    """A worker's load when it sent a response: what the gateway's router scores it by."""

    num_running: int = 0
    num_waiting: int = 0
    #: batch slots (max_batch_size)
    num_slots: int = 0
    #: KV positions the running rows hold over what the batch's caches hold, 0..1
    kv_utilization: float = 0.0
    #: tokens a running row commits per second (moving average over steps); 0 = not measured yet
    row_tokens_per_s: float = 0.0
    #: rows of the steps that rate was measured over (the same moving average; 0 = unknown): a row's rate falls as
    #: rows join its batch, so a rate measured at 8 rows and one measured at 1 are not the same worker's speed
    rate_rows: float = 0.0
    #: service class -> acceptance length τ of its rows' verify rounds (moving average); a class without rounds
    #: is absent
    acceptance: dict[str, float] = field(default_factory=dict)

    def to_params(self) -> dict[str, int | float | str]:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["acceptance"] = ",".join(f"{c}={tau:.3f}" for c, tau in self.acceptance.items())
        return {LOAD_PARAM_PREFIX + name: value for name, value in values.items()}

    @classmethod
    def from_params(cls, params: dict[str, int | float | str]) -> WorkerLoad | None:
        """The load in `params` (name -> value, prefixed); None when they carry none. Malformed values read as
        absent: load only steers routing, it never fails a request."""
        if LOAD_PARAM_PREFIX + "num_slots" not in params:
            return None
        values = {}
        for f in fields(cls):
            value = params.get(LOAD_PARAM_PREFIX + f.name)
            if f.name == "acceptance":
                pairs = (item.partition("=") for item in str(value or "").split(",") if item)
                values["acceptance"] = {
                    c: float(tau) for c, _, tau in pairs if c in SERVICE_CLASSES and tau.replace(".", "", 1).isdigit()
                }
            elif isinstance(value, (int, float)) and not isinstance(value, bool):
                values[f.name] = type(getattr(cls, f.name))(value)
        return cls(**values)


#: the distributions logprobs may be of (deepspec.decoding.logprobs.LOGPROBS_MODES, mirrored)
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs")

#: what a Constraint may be (deepspec.decoding.structured.KINDS, mirrored: the gateway image has no deepspec library)
STRUCTURED_OUTPUT_KINDS = ("json_object", "json_schema", "regex", "grammar", "choice")


@dataclass(frozen=True)
class Constraint:
    """The structured-output constraint of one request, as the worker protocol carries it (`EXTRA_STRUCTURED_OUTPUT`):
    `spec` is the JSON schema text (json_schema), the regex, the EBNF grammar (xgrammar's dialect, `root ::= ...`),
    or a JSON list of the allowed strings (choice); json_object has none."""

    kind: str
    spec: str = ""

    def encode(self) -> str:
        return json.dumps({"kind": self.kind, "spec": self.spec}, ensure_ascii=False)

    @classmethod
    def decode(cls, text: str) -> Constraint:
        """The Constraint `text` encodes; ValueError naming what is wrong (the kind and spec themselves are the
        engine's to check)."""
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{EXTRA_STRUCTURED_OUTPUT} is not valid JSON: {e}") from None
        if (
            not isinstance(value, dict)
            or set(value) - {"kind", "spec"}
            or not isinstance(value.get("kind"), str)
            or not isinstance(value.get("spec", ""), str)
        ):
            raise ValueError(f'{EXTRA_STRUCTURED_OUTPUT} must be {{"kind": str, "spec": str}}, got {text[:200]!r}')
        return cls(value["kind"], value.get("spec", ""))


#: response parameter that flags the last response of a decoupled stream (Triton's name)
FINAL_RESPONSE_PARAM = "triton_final_response"

#: the `platform` DeepSpec's worker reports in its ModelConfig: a decoupled model that also answers ModelInfer
WORKER_PLATFORM = "deepspec"
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


#: An upper bound on the characters one token decodes to. The longest token of the default target's vocabulary
#: (SmolLM2, 49,152 tokens) is 81 characters (a newline and 80 spaces); 128 leaves room for other vocabularies.
#: A prompt longer than `context length x MAX_CHARS_PER_TOKEN` characters cannot fit, whatever it says, so it is
#: refused by the gateway and again by the worker (which a client may call directly) before anything tokenizes it.
MAX_CHARS_PER_TOKEN = 128


def max_prompt_chars(context_len: int) -> int:
    """The longest prompt, in characters, that could still fit `context_len` tokens."""
    return context_len * MAX_CHARS_PER_TOKEN


#: ModelInfer trailing metadata key carrying the engine's error code (gRPC metadata keys are lower case)
ERROR_CODE_METADATA = "deepspec-error-code"
#: parameter of a stream's error `infer_response` carrying the engine's error code
ERROR_CODE_PARAM = "error_code"
#: the codes the engine's validation may send (values of deepspec.decoding.validation.RequestErrorCode)
ERROR_CODES = (
    "prompt_empty",
    "prompt_token_invalid",
    "context_length_exceeded",
    "max_tokens_invalid",
    "sampling_invalid",
    "request_id_in_use",
    "structured_output_invalid",
)


def _sent_in(output: str):
    """A count of `RequestStats`, sent in the INT32 output tensor `output` of every response."""
    return field(default=0, metadata={"output": output})


@dataclass(frozen=True)
class RequestStats:
    """A request's cumulative counts so far; every streamed response carries them, so the last one is the usage."""

    #: exact prompt length after tokenization / chat template
    num_prompt_tokens: int = _sent_in(EXTRA_NUM_PROMPT_TOKENS)
    #: tokens generated so far
    num_output_tokens: int = _sent_in(EXTRA_NUM_OUTPUT_TOKENS)
    #: draft tokens proposed for this request (0 without a drafter)
    num_draft_tokens: int = _sent_in(NUM_DRAFT_TOKENS)
    #: of those, accepted by the target
    num_accepted_tokens: int = _sent_in(NUM_ACCEPTED_TOKENS)
    #: verify rounds that had drafts
    num_spec_steps: int = _sent_in(EXTRA_NUM_SPEC_STEPS)

    @property
    def acceptance_length(self) -> float | None:
        """Mean tokens committed per drafted round (accepted + 1), the paper's tau; None before any draft."""
        if not self.num_spec_steps:
            return None
        return (self.num_accepted_tokens + self.num_spec_steps) / self.num_spec_steps


#: RequestStats field -> the INT32 output tensor carrying it
STATS_OUTPUTS = {f.name: f.metadata["output"] for f in fields(RequestStats)}
