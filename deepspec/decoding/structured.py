"""Structured outputs under speculation: a grammar constrains the drafts before the verify pass and the target's
distribution at every verified position, and the output stays exactly the constrained target distribution.

The grammar engine is xgrammar, the default of vLLM, SGLang and TensorRT-LLM (so a request constrains the same way
here as in the GPU engine a team already runs), and made for this: its matcher accepts tokens and rolls them back,
which is how drafts are checked and forgotten again each round, and it fills a bitmask of the allowed next tokens
in microseconds per position from a grammar compiled once per request shape (its compiler caches).

One round of a constrained row (deepspec/decoding/engine.py):

1. `RowGrammar.walk` runs the row's proposal through the matcher: the mask of allowed tokens at the root (after the
   committed text), then for each node whether the grammar allows its token after its parent, and the mask after
   it. A node the grammar forbids is cut with its subtree before the verify pass: no target compute is spent on it.
   Then the matcher is rolled back: nothing is committed yet.
2. The target's logits at every verified position are masked (forbidden tokens to -inf) before verification, so
   greedy rows take the argmax among allowed tokens, and sampled rows' temperature, top-k and top-p act on the
   constrained distribution p', as in vLLM, where the bitmask is applied before the sampler. Logprobs are read
   after the mask too (vLLM's do the same): a forbidden token has logprob -inf.
3. The draft's q at each kept node is masked and renormalised the same way (q'). This is what keeps sampling exact:
   a draft is kept exactly when the grammar allows it, and then it is distributed as q'; rejection sampling with
   (p', q') outputs p'. A cut draft means the round samples p' directly. Either way the output is p' (a cut draft
   verified with the raw q would have made the residual max(p' - q, 0) skew the output: tests/deepspec/decoding/
   test_structured.py's negative control shows it).
4. `RowGrammar.accept` advances the matcher by the committed tokens; a matcher that terminated ends the request
   with finish reason "stop".

Dead ends. A grammar whose language is empty, or whose next character no token of this vocabulary can spell, allows
no token at all. At the start that is a refusal (`GrammarCompiler.check`, from `SpecEngine.validate`); later (a
draft node or a committed token leading there) the node is cut, and a request whose committed output reached one
ends alone with finish reason "abort": the engine never raises from a step for one request's grammar.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property

import torch

from deepspec.decoding.validation import RequestError, RequestErrorCode

#: what a request's output may be asked to match (vLLM's structured_outputs / guided_* kinds)
KINDS = ("json_object", "json_schema", "regex", "grammar", "choice")


@dataclass(frozen=True)
class StructuredOutput:
    """The constraint of one request. `spec` is the JSON schema text (json_schema), the regular expression
    (regex), the EBNF grammar (grammar, xgrammar's GBNF dialect with `root ::= ...`), or a JSON list of the allowed
    strings (choice); json_object needs none."""

    kind: str
    spec: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise RequestError(
                RequestErrorCode.STRUCTURED_OUTPUT_INVALID,
                f"structured output kind must be one of {', '.join(KINDS)}, got {self.kind!r}",
            )
        if self.kind != "json_object" and not self.spec:
            raise RequestError(RequestErrorCode.STRUCTURED_OUTPUT_INVALID, f"a {self.kind} constraint needs its spec")

    @classmethod
    def choice(cls, options: list[str]) -> StructuredOutput:
        return cls("choice", json.dumps(list(options)))


def _invalid(message: str) -> RequestError:
    return RequestError(RequestErrorCode.STRUCTURED_OUTPUT_INVALID, message)


def _choice_grammar(spec: str) -> str:
    try:
        options = json.loads(spec)
    except json.JSONDecodeError:
        options = None
    if not isinstance(options, list) or not options or not all(isinstance(o, str) and o for o in options):
        raise _invalid("a choice constraint is a non-empty list of non-empty strings")
    # EBNF string literals take JSON's escapes
    return "root ::= " + " | ".join(json.dumps(o) for o in options)


class GrammarCompiler:
    """Compiles constraints against one target's vocabulary (once per distinct constraint: xgrammar caches) and
    makes each request's matcher. Thread-safe: servers compile in `SpecEngine.validate`, off the engine thread."""

    def __init__(self, target):
        self.vocab_size = target.vocab_size
        self.stop_token_ids = tuple(target.eos_token_ids)
        self._tokenizer = target.tokenizer
        self._decode = target.decode

    @cached_property
    def _compiler(self):
        try:
            import xgrammar
        except ImportError:
            raise _invalid("structured outputs need the xgrammar package: pip install xgrammar") from None
        return xgrammar.GrammarCompiler(self._tokenizer_info(xgrammar), max_threads=2)

    def _tokenizer_info(self, xgrammar):
        from transformers import PreTrainedTokenizerBase

        stop = list(self.stop_token_ids) or None
        if isinstance(self._tokenizer, PreTrainedTokenizerBase):
            return xgrammar.TokenizerInfo.from_huggingface(
                self._tokenizer, vocab_size=self.vocab_size, stop_token_ids=stop
            )
        # a tokenizer whose every id decodes to whole characters (the tests' character tokenizers): its text is the
        # vocabulary as it is
        vocab = [self._decode([i]) for i in range(self.vocab_size)]
        return xgrammar.TokenizerInfo(vocab, xgrammar.VocabType.RAW, vocab_size=self.vocab_size, stop_token_ids=stop)

    def compile(self, constraint: StructuredOutput):
        """The compiled grammar; RequestError(STRUCTURED_OUTPUT_INVALID) naming what is wrong with the spec."""
        compiler = self._compiler
        try:
            if constraint.kind == "json_object":
                return compiler.compile_builtin_json_grammar()
            if constraint.kind == "json_schema":
                return compiler.compile_json_schema(constraint.spec)
            if constraint.kind == "regex":
                return compiler.compile_regex(constraint.spec)
            text = _choice_grammar(constraint.spec) if constraint.kind == "choice" else constraint.spec
            return compiler.compile_grammar(text)
        except RequestError:
            raise
        except Exception as exc:  # xgrammar raises RuntimeError / ValueError subclasses with the parser's message
            raise _invalid(f"invalid {constraint.kind} constraint: {str(exc).strip().splitlines()[0][:300]}") from None

    def matcher(self, constraint: StructuredOutput) -> RowGrammar:
        return RowGrammar(self.compile(constraint), self.vocab_size, self.stop_token_ids)

    def check(self, constraint: StructuredOutput) -> None:
        """Refuse a constraint that does not compile, or whose output cannot even start: no token of this
        vocabulary is allowed first (an empty language, or a first character no token spells)."""
        grammar = self.matcher(constraint)
        if not grammar.can_continue():
            raise _invalid(f"the {constraint.kind} constraint admits no output this model's vocabulary can spell")


class RowGrammar:
    """One request's grammar state: the matcher advanced over the committed output, and the round's checks."""

    def __init__(self, compiled, vocab_size: int, stop_token_ids: tuple[int, ...]):
        import xgrammar

        self._xgr = xgrammar
        self.vocab_size = vocab_size
        self.matcher = xgrammar.GrammarMatcher(
            compiled, override_stop_tokens=list(stop_token_ids) or None, terminate_without_stop_token=not stop_token_ids
        )
        #: the committed output reached a state that allows no token (the module docstring's dead ends)
        self.dead = False

    @property
    def terminated(self) -> bool:
        return self.matcher.is_terminated()

    def can_continue(self) -> bool:
        """Whether the grammar is complete or allows some token after the committed output."""
        return self._fill(self._xgr.allocate_token_bitmask(1, self.vocab_size), 0)

    def root_mask(self) -> torch.Tensor:
        """[1, W] int32 bitmask of the tokens allowed after the committed output (all at a dead end)."""
        return self.walk([], [])[1]

    def walk(self, tokens: list[int], parents: list[int]) -> tuple[list[bool], torch.Tensor]:
        """A proposal's nodes (parents[i] = -1 for the root or an earlier node) → (kept[i]: the grammar allows
        node i's token after its kept parent, bitmask [1 + n, W]: row 0 the root's allowed tokens, row 1 + i
        those after node i; all allowed where nothing is constrained: past a terminated state or a cut node). The
        matcher ends where it started."""
        n = len(tokens)
        masks = self._xgr.allocate_token_bitmask(1 + n, self.vocab_size)
        kept = [False] * n
        path: list[int] = []  # the accepted nodes from the root to the matcher's current state
        if not self._fill(masks, 0):  # a dead end: left unconstrained, so the commit that follows ends the request
            masks[0] = -1
            return kept, masks
        for i, (token, parent) in enumerate(zip(tokens, parents)):
            if parent >= 0 and not kept[parent]:
                continue
            self._move_to(path, _root_path(parent, parents), tokens)
            if self.matcher.is_terminated() or not _allowed(masks[1 + parent], token):
                continue
            if not self.matcher.accept_token(token):
                raise RuntimeError(f"the grammar's bitmask allowed token {token} that its matcher refused")
            path.append(i)
            kept[i] = self._fill(masks, 1 + i)  # a node leading to a dead end is cut
            if not kept[i]:
                masks[1 + i] = -1
        if path:
            self.matcher.rollback(len(path))
        return kept, masks

    def _move_to(self, path: list[int], goal: list[int], tokens: list[int]) -> None:
        """Roll the matcher back to where `path` (nodes accepted from the root) and `goal` agree, then accept the
        rest of `goal`: nodes come in topological order, not depth-first, so a node's parent may be on a branch
        walked earlier."""
        common = 0
        while common < min(len(path), len(goal)) and path[common] == goal[common]:
            common += 1
        if len(path) > common:
            self.matcher.rollback(len(path) - common)
            del path[common:]
        for node in goal[common:]:
            self.matcher.accept_token(tokens[node])
            path.append(node)

    def _fill(self, masks: torch.Tensor, row: int) -> bool:
        """Fill masks[row] with the tokens allowed in the matcher's state; False at a dead end (none allowed)."""
        if self.matcher.is_terminated():
            masks[row] = -1  # nothing can follow; what the target predicts there is never committed
            return True
        self.matcher.fill_next_token_bitmask(masks, row)
        return bool(masks[row].any())

    def accept(self, tokens: list[int]) -> int:
        """Advance over committed tokens (each allowed by the masks the round verified with) → how many belong to
        the output: all, those up to the one that completed the grammar (what follows it is unconstrained), or those
        before one the grammar refuses, which only a dead end lets through (then `dead` is set)."""
        for i, token in enumerate(tokens):
            if self.matcher.is_terminated():
                return i
            if not self.matcher.accept_token(token):
                self.dead = True
                return i
        return len(tokens)


def _root_path(node: int, parents: list[int]) -> list[int]:
    """The nodes from the root's first child down to `node` (empty for the root, -1)."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def _allowed(mask_row: torch.Tensor, token: int) -> bool:
    return bool((int(mask_row[token >> 5]) >> (token & 31)) & 1)


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int32 bitmask [..., W] → bool [..., vocab_size] (bit j of word w allows token 32 w + j), on its device."""
    bits = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    return ((bitmask[..., None] >> bits) & 1).bool().flatten(-2)[..., :vocab_size]


def mask_logits_(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """In place: logits [T, V] (a contiguous view into the verify pass's) with the tokens bitmask [T, W] row j
    forbids at position j set to -inf, by xgrammar's own kernel (CPU, or Triton on CUDA)."""
    import xgrammar

    xgrammar.apply_token_bitmask_inplace(logits, bitmask.to(logits.device))


def restrict_draft_probs(q: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """q [T, V] (the distribution each drafted token was drawn from) restricted to the tokens bitmask [T, W]
    allows and renormalised: the distribution of a draft the grammar kept. Rows with no allowed mass stay."""
    allowed = allowed_tokens(bitmask.to(q.device), q.shape[-1])
    kept = q * allowed
    total = kept.sum(-1, keepdim=True)
    return torch.where(total > 0, kept / total.clamp(min=torch.finfo(q.dtype).tiny), q)
