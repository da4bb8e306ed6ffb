"""The contract between a caller and the engine: what a request asks for and what each step returns.

No behaviour lives here beyond validating input at the boundary, so bad requests fail with a `RequestError` whose
message names the field and the allowed range.
"""

import math
import numbers
from dataclasses import dataclass, field

from deepspec.decoding.logprobs import LOGPROBS_MODES, MAX_TOP_LOGPROBS, TokenLogprob
from deepspec.decoding.structured import StructuredOutput
from deepspec.decoding.validation import RequestError, RequestErrorCode


@dataclass(frozen=True)
class SamplingParams:
    #: maximum number of generated tokens (the prompt is not counted); >= 1, or 0 to only score the prompt
    #: (prompt_logprobs set)
    max_tokens: int = 128
    #: 0 = greedy (argmax); > 0 scales logits before sampling
    temperature: float = 0.0
    #: keep only the k most likely tokens; 0 = off
    top_k: int = 0
    #: nucleus sampling mass in (0, 1]; 1 = off
    top_p: float = 1.0
    #: per-request RNG seed; None draws from the engine's generator
    seed: int | None = None
    #: generation stops when the text contains one of these (the stop string is not returned)
    stop: tuple[str, ...] = ()
    #: extra token ids that end generation (the target's EOS is always one unless ignore_eos)
    stop_token_ids: tuple[int, ...] = ()
    #: keep generating past EOS until max_tokens (benchmarks)
    ignore_eos: bool = False
    #: return each emitted token's logprob and this many top alternatives (0 = the token's only); None = off
    logprobs: int | None = None
    #: which distribution those logprobs are of (vLLM's names): "raw_logprobs", the model's (the default), or
    #: "processed_logprobs", the one the token was sampled from (temperature, top-k, top-p applied: logprobs.py)
    logprobs_mode: str = "raw_logprobs"
    #: return each prompt token's raw logprob (the first has none) and this many alternatives; None = off
    prompt_logprobs: int | None = None
    #: the output must match this JSON schema, regex, grammar or choice (deepspec/decoding/structured.py); None = free
    structured: StructuredOutput | None = None
    #: this request's speculation: at most this many draft tokens verified per round (0 = speculation off for the
    #: request, decoded target-only); None = the engine's own setting. Greedy output is the same in every mode.
    max_draft_tokens: int | None = None
    #: the session whose earlier answers may draft this one, and which remembers it (session_memory.py): an opaque
    #: key the server derives from the API key and the client's session id, so sessions never cross keys; None = off
    session: str | None = None
    #: scheduling order (vLLM's rule: lower first): a waiting prompt is prefilled before waiting prompts of a larger
    #: priority, so an interactive request is not stuck behind a batch flood's prompts; output never depends on it
    priority: int = 0

    def __post_init__(self) -> None:
        min_tokens = 0 if self.prompt_logprobs is not None else 1
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < min_tokens:
            raise RequestError(
                RequestErrorCode.MAX_TOKENS_INVALID,
                f"max_tokens must be an integer >= 1 (0 only to score the prompt, with "
                f"prompt_logprobs), got {self.max_tokens!r}",
            )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_TOP_LOGPROBS
            ):
                raise _sampling_error(
                    f"{name} must be an integer in [0, {MAX_TOP_LOGPROBS}] (None = off), got {value!r}"
                )
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise _sampling_error(f"priority must be an integer (lower is scheduled first), got {self.priority!r}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise _sampling_error(
                f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}, got {self.logprobs_mode!r}"
            )
        if (
            not isinstance(self.temperature, numbers.Real)
            or not math.isfinite(self.temperature)
            or self.temperature < 0
        ):
            raise _sampling_error(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if self.top_k < 0:
            raise _sampling_error(f"top_k must be >= 0 (0 = off), got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:  # also refuses NaN
            raise _sampling_error(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and (
            not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed < 2**64
        ):
            raise _sampling_error(f"seed must be an integer in [0, 2**64) or None, got {self.seed!r}")
        if self.max_draft_tokens is not None and (
            not isinstance(self.max_draft_tokens, int)
            or isinstance(self.max_draft_tokens, bool)
            or self.max_draft_tokens < 0
        ):
            raise _sampling_error(
                f"max_draft_tokens must be an integer >= 0 (0 = speculation off, None = the "
                f"server's setting), got {self.max_draft_tokens!r}"
            )
        if self.session is not None and (not isinstance(self.session, str) or not 0 < len(self.session) <= 512):
            raise _sampling_error(
                f"session must be a non-empty string of at most 512 characters or None, got {self.session!r}"
            )
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        if any(not s for s in self.stop):
            raise _sampling_error("stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class StepOutput:
    """What one engine step produced for one request."""

    request_id: str
    #: tokens committed this step (accepted drafts + the target's own token), already cut at a stop
    new_token_ids: list[int]
    #: text of those tokens, as safe to stream (incomplete UTF-8 is held back until it completes)
    new_text: str
    finished: bool = False
    #: "stop" (EOS or stop string), "length" (max_tokens or context full), "abort"
    finish_reason: str | None = None
    #: draft tokens proposed for this request in this step (0 without a drafter)
    num_draft_tokens: int = 0
    #: of those, how many the target accepted
    num_accepted_tokens: int = 0
    #: tokens scored for this request in this step's verify pass (its pending token + its drafts; 0 at prefill)
    num_verify_tokens: int = 0
    #: aligned with new_token_ids when the request asked for logprobs; else None
    logprobs: list[TokenLogprob] | None = None
    #: when the request asked for logprobs and a stop token (EOS, stop_token_ids) ended it: that token's logprob.
    #: The token is not emitted, but a scorer asking "what came next" (lm-eval's echo + max_tokens 1) needs it
    stop_logprob: TokenLogprob | None = None
    #: once, in the prefill step's output, when the request asked for prompt_logprobs: one per prompt token, the
    #: first None (nothing predicts it)
    prompt_logprobs: list[TokenLogprob | None] | None = None

    def merge(self, more: "StepOutput") -> None:
        """Append what a later phase of the same step produced for this request (the prefill's first token, then
        its first round)."""
        self.new_token_ids.extend(more.new_token_ids)
        self.new_text += more.new_text
        self.finished, self.finish_reason = more.finished, more.finish_reason
        self.num_draft_tokens += more.num_draft_tokens
        self.num_accepted_tokens += more.num_accepted_tokens
        self.num_verify_tokens += more.num_verify_tokens
        if self.logprobs is not None and more.logprobs is not None:
            self.logprobs.extend(more.logprobs)
        self.stop_logprob = more.stop_logprob


@dataclass(kw_only=True)
class AcceptanceStats:
    """A request's speculation counters: the engine keeps one per running sequence and hands it back in the
    request's `GenerationResult`. Positions count depth: slot j of a chain, the nodes at depth j + 1 of a tree."""

    #: speculative rounds (target verify passes) this request took, drafted or not
    num_steps: int = 0
    #: of those, the rounds that verified at least one draft: τ's denominator. A round the verify budget or the
    #: drafter left without drafts commits the target's token alone and says nothing about the draft
    num_drafted_steps: int = 0
    #: draft tokens (chain slots or tree nodes) verified, over all rounds
    num_draft_tokens: int = 0
    #: of those, how many the target accepted (a tree's accepted path length)
    num_accepted_tokens: int = 0
    #: tokens this request fed the verify passes (its pending token + its drafts, each round)
    num_verify_tokens: int = 0
    #: accepted_per_position[i] = rounds in which draft position i was accepted
    accepted_per_position: list[int] = field(default_factory=list)
    #: proposed_per_position[i] = rounds in which draft position i was proposed (survival = accepted / proposed)
    proposed_per_position: list[int] = field(default_factory=list)

    def record(self, num_drafts: int, num_accepted: int, depth: int | None = None) -> None:
        """One verify round: num_drafts drafts (nodes) reaching `depth` (None = a chain, depth = num_drafts), of
        which the first num_accepted positions were accepted."""
        depth = num_drafts if depth is None else depth
        self.num_steps += 1
        self.num_drafted_steps += int(num_drafts > 0)
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        self.num_verify_tokens += 1 + num_drafts
        grow = depth - len(self.proposed_per_position)
        if grow > 0:
            self.proposed_per_position.extend([0] * grow)
            self.accepted_per_position.extend([0] * grow)
        for i in range(depth):
            self.proposed_per_position[i] += 1
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1

    @property
    def acceptance_length(self) -> float | None:
        """τ, the paper's acceptance length: tokens committed per round that verified drafts (its accepted drafts +
        the target's own token). The one definition: eval.json, `--draft auto`, the service's RequestStats and its
        metrics count the same. None when no round drafted: such a request has no τ (1.0 would read as a draft
        that is always rejected)."""
        if not self.num_drafted_steps:
            return None
        return (self.num_accepted_tokens + self.num_drafted_steps) / self.num_drafted_steps

    @property
    def tokens_per_forward(self) -> float | None:
        """Tokens committed per target verify pass over every round, drafted or not: (accepted + rounds) / rounds.
        τ counts only the rounds that drafted, so a draft that rarely drafts can show a high τ and win nothing; this
        is what speculation bought per forward. None before the first round."""
        if not self.num_steps:
            return None
        return (self.num_accepted_tokens + self.num_steps) / self.num_steps

    @property
    def verify_tokens_per_step(self) -> float:
        """Mean tokens scored per target pass for this request (1 + chain length or tree nodes), over every pass,
        drafted or not: what the verify passes cost, not what they earned."""
        return self.num_verify_tokens / max(self.num_steps, 1)


@dataclass
class GenerationResult(AcceptanceStats):
    """A whole request's outcome, as `SpecEngine.generate` returns it: its tokens and text, and its
    `AcceptanceStats` (num_steps, num_draft_tokens, ... as keyword arguments and attributes)."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    #: aligned with token_ids when asked for (SamplingParams.logprobs); else None
    logprobs: list[TokenLogprob] | None = None
    #: aligned with prompt_token_ids when asked for (SamplingParams.prompt_logprobs), the first None
    prompt_logprobs: list[TokenLogprob | None] | None = None


def _sampling_error(message: str) -> RequestError:
    return RequestError(RequestErrorCode.SAMPLING_INVALID, message)
