"""A tiny deterministic `Target` (and a drafter for it) that the worker runs under the real `SpecEngine` with
`--target stub`: service tests and the gateway-overhead benchmark exercise the real engine, scheduler and
validation without weights.

- Tokenizer: byte level, one token per UTF-8 byte (vocab 256, so counts are easy to check by hand); the chat
  template is `<|role|>content\\n` per message followed by `<|assistant|>`. Byte 0 is the EOS id, which the stub
  never predicts.
- Model: it writes `STUB_TEXT` over and over. The next token after a context is `CYCLE[m % len(STUB_TEXT)]`, where m
  is how many of the context's last tokens already spell the cycle from its start (so a prompt that ends elsewhere
  gets `STUB_TEXT` from its first character, and "The" is continued with " quick"). "T" opens the cycle and occurs
  nowhere else in it, so m is a one-token automaton: m + 1 when the token continues the cycle, else 1 for "T",
  else 0. The "KV cache" holds m per slot and position, so rejected drafts roll back like real ones.
  Logits put 0 on the next token and -1e9 elsewhere: greedy and sampled requests (any temperature) read the same.
- `StubDrafter`: proposes the true continuation with one wrong token at depth `round % (k + 1)`, so acceptance
  cycles 0..k and the spec-decode metrics move like a real draft's.
- `step_delay_s` sleeps in each forward: a simulated model step time.
"""

from __future__ import annotations

import time

import torch

from deepspec.decoding.drafter import DraftSampling, KVDrafter, Proposal
from deepspec.models.arch import ArchSpec
from deepspec.models.decoder import DecoderOutput
from deepspec.models.target import TargetEmbeddings

STUB_TEXT = "The quick brown fox jumps over the lazy dog. "
CYCLE = list(STUB_TEXT.encode("ascii"))
EOS_TOKEN_ID = 0
VOCAB_SIZE = 256
#: a byte that never continues the cycle: the stub drafter's wrong guess
_WRONG = ord("#")
_NEG = -1e9


def _advance(m: int, token: int) -> int:
    """Cycle-match length after `token`, given m before it."""
    if token == CYCLE[m % len(CYCLE)]:
        return m + 1
    return 1 if token == CYCLE[0] else 0


class StubCache:
    """m per (slot, position): [num_slots, max_seq_len] long. `rows` is a view, as the protocol asks."""

    def __init__(self, num_slots: int, max_seq_len: int, match: torch.Tensor | None = None):
        self.match = match if match is not None else torch.zeros(num_slots, max_seq_len, dtype=torch.long)

    def rows(self, first: int, count: int) -> StubCache:
        return StubCache(0, 0, self.match[first : first + count])

    def move_slot(self, src: int, dst: int, length: int) -> None:
        self.match[dst, :length] = self.match[src, :length]


class StubTarget:
    name: str = "stub"
    eos_token_ids: tuple[int, ...] = (EOS_TOKEN_ID,)
    quantization: str = "none"
    tokenizer: object = None
    #: forward is a chain automaton; token trees reach it as chains of first children
    supports_tree_attention: bool = False
    host_threads: int | None = None
    multi_token_rows_serial: bool = False
    #: forward takes no row_lengths: every row of a pass has its T tokens
    ragged_rows: bool = False
    device = torch.device("cpu")
    dtype = attention_dtype = torch.float32
    vocab_size = VOCAB_SIZE

    def __init__(self, max_seq_len: int = 2048, step_delay_s: float = 0.0):
        self.max_seq_len = max_seq_len
        self.step_delay_s = step_delay_s
        self.spec = ArchSpec(
            family="stub",
            vocab_size=VOCAB_SIZE,
            hidden_size=8,
            num_layers=2,
            num_heads=1,
            num_kv_heads=1,
            head_dim=8,
            intermediate_size=8,
            rms_norm_eps=1e-6,
            rope_theta=1e4,
            tie_word_embeddings=True,
            max_position_embeddings=max_seq_len,
        )

    # ---- text --------------------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_chat(self, messages: list[dict]) -> list[int]:
        return self.encode("".join(f"<|{m['role']}|>{m['content']}\n" for m in messages) + "<|assistant|>")

    def decode(self, token_ids: list[int]) -> str:
        return bytes(t for t in token_ids if t != EOS_TOKEN_ID).decode("utf-8", errors="replace")

    def recorded_step_curve(self) -> None:
        """No step curve: a stub's timing means nothing."""
        return None

    def fingerprint(self) -> dict:
        return {
            "architecture": "stub",
            "hidden_size": 8,
            "num_layers": 2,
            "vocab_size": VOCAB_SIZE,
            "tokenizer_hash": "bytes",
        }

    # ---- model -------------------------------------------------------------------------------------------------
    def new_cache(self, num_slots: int, max_seq_len: int) -> StubCache:
        return StubCache(num_slots, max_seq_len)

    def forward(
        self,
        tokens: torch.Tensor,
        start: torch.Tensor,
        cache: object | None = None,
        *,
        feature_layers: tuple[int, ...] = (),
        logits: str | torch.Tensor = "all",
        return_final_hidden: bool = False,
        max_start: int | None = None,
        tree_parents: torch.Tensor | None = None,
    ) -> DecoderOutput:
        """tokens [B, T], start [B] → logits over the next token at each position (see the module docstring)."""
        if cache is not None and not isinstance(cache, StubCache):
            raise TypeError(f"the stub target reads its own StubCache, got {type(cache).__name__}")
        if tree_parents is not None:
            raise ValueError("the stub target verifies chains only (supports_tree_attention is False)")
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        B, T = tokens.shape
        match = torch.zeros(B, T, dtype=torch.long)
        for b, (row, first) in enumerate(zip(tokens.tolist(), start.tolist())):
            m = int(cache.match[b, first - 1]) if cache is not None and first > 0 else 0
            for t, token in enumerate(row):
                m = _advance(m, token)
                match[b, t] = m
            if cache is not None:
                cache.match[b, first : first + T] = match[b]
        if isinstance(logits, str):
            picked = {"all": match, "last": match[:, -1:], "none": None}[logits]
        else:  # [B] positions
            picked = match.gather(1, logits.view(B, 1).long())
        out_logits = None
        if picked is not None:
            cycle = torch.tensor(CYCLE)
            out_logits = torch.full((*picked.shape, VOCAB_SIZE), _NEG)
            out_logits.scatter_(-1, cycle[picked % len(CYCLE)].unsqueeze(-1), 0.0)
        H = self.spec.hidden_size
        features = torch.zeros(B, T, len(feature_layers) * H) if feature_layers else None
        return DecoderOutput(out_logits, features, torch.zeros(B, T, H) if return_final_hidden else None)

    def lm_head(self, final_hidden: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*final_hidden.shape[:-1], VOCAB_SIZE)

    def embeddings(self) -> TargetEmbeddings:
        table = torch.zeros(VOCAB_SIZE, self.spec.hidden_size)
        return TargetEmbeddings(table, 1.0, table)

    def default_feature_layers(self, count: int = 5) -> tuple[int, ...]:
        return tuple(range(min(count, self.spec.num_layers)))


class StubDrafter(KVDrafter):
    """The stub target's continuation with its first wrong token at depth `round % (k + 1)` (k = no wrong one)."""

    name = "stub"

    def __init__(self):
        self._match: dict[int, int] = {}
        self._rounds: dict[int, int] = {}

    def reset(self, slot: int, first_token: int) -> None:
        self._match[slot] = _advance(0, first_token)
        self._rounds[slot] = 0

    def commit(self, slots, tokens, num_tokens, features) -> None:
        for row, slot in enumerate(slots):
            for token in tokens[row, : int(num_tokens[row])].tolist():
                self._match[slot] = _advance(self._match[slot], token)

    def propose(self, view, slots: list[int], k: int, sampling: DraftSampling) -> Proposal:
        tokens = torch.empty(len(slots), k, dtype=torch.long)
        for row, slot in enumerate(slots):
            m, wrong_at = self._match[slot], self._rounds[slot] % (k + 1)
            tokens[row] = torch.tensor([CYCLE[(m + j) % len(CYCLE)] if j != wrong_at else _WRONG for j in range(k)])
            self._rounds[slot] += 1
        return Proposal.from_rows(tokens, torch.full((len(slots),), k, dtype=torch.long))

    def move_slot(self, src: int, dst: int) -> None:
        self._match[dst], self._rounds[dst] = self._match.pop(src), self._rounds.pop(src)

    def release(self, slot: int) -> None:
        self._match.pop(slot, None)
        self._rounds.pop(slot, None)
