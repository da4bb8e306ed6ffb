"""A fast, deterministic stand-in for `deepspec.decoding.SpecEngine` and its target, with exactly their API.

For tests and the gateway-overhead benchmark: no weights, no torch. The tokenizer is byte-level (one token per
UTF-8 byte, so counts are easy to check by hand); the chat template is `<|role|>content\n` per message followed by
`<|assistant|>`. Generation cycles through `STUB_TEXT`; every step commits `1 + accepted` tokens, where the
"drafter" proposes `num_speculative_tokens` tokens and the first `accepted` of them (a fixed pattern 0..k) pass,
so the spec-decode metrics move like a real engine's. `step_delay_s` simulates the model's step time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from deepspec.decoding.params import SamplingParams, StepOutput

STUB_TEXT = "The quick brown fox jumps over the lazy dog. "
EOS_TOKEN_ID = 0


class StubTarget:
    name = "stub"
    eos_token_ids = (EOS_TOKEN_ID,)
    tokenizer = None

    def __init__(self, max_seq_len: int = 2048):
        self.max_seq_len = max_seq_len

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_chat(self, messages: list[dict]) -> list[int]:
        rendered = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages) + "<|assistant|>"
        return self.encode(rendered)

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


@dataclass
class _Sequence:
    request_id: str
    params: SamplingParams
    num_prompt_tokens: int
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    num_steps: int = 0


class StubEngine:
    def __init__(self, target: StubTarget, drafter=None, max_batch_size: int = 8, max_seq_len: int = 2048,
                 num_speculative_tokens: int = 3, step_delay_s: float = 0.0):  # fmt: skip
        self.target = target
        self.max_batch_size = max_batch_size
        self.max_seq_len = min(max_seq_len, target.max_seq_len)
        self.num_speculative_tokens = num_speculative_tokens if drafter is not None else 0
        self.step_delay_s = step_delay_s
        self._new: dict[str, _Sequence] = {}
        self._running: dict[str, _Sequence] = {}

    @property
    def num_running(self) -> int:
        return len(self._new) + len(self._running)

    @property
    def num_free_slots(self) -> int:
        return self.max_batch_size - self.num_running

    def has_unfinished(self) -> bool:
        return self.num_running > 0

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        if not prompt_token_ids:
            raise ValueError("the prompt is empty: send at least one token")
        if len(prompt_token_ids) + params.max_tokens > self.max_seq_len:
            raise ValueError(
                f"prompt ({len(prompt_token_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the context "
                f"length of {self.max_seq_len} tokens; shorten the prompt or lower max_tokens"
            )
        if request_id in self._new or request_id in self._running:
            raise ValueError(f"request id {request_id!r} is already running")
        if self.num_free_slots <= 0:
            raise RuntimeError("no free slot: check engine.num_free_slots before add_request")
        self._new[request_id] = _Sequence(request_id, params, len(prompt_token_ids))

    def abort(self, request_id: str) -> bool:
        return self._new.pop(request_id, None) is not None or self._running.pop(request_id, None) is not None

    def step(self) -> list[StepOutput]:
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        outputs = []
        for seq in list(self._new.values()):  # prefill: the first token only
            del self._new[seq.request_id]
            self._running[seq.request_id] = seq
            outputs.append(self._commit(seq, 1, 0, 0))
        for seq in list(self._running.values()):
            if seq.num_steps == 0:
                seq.num_steps = 1
                continue
            k = self.num_speculative_tokens
            accepted = seq.num_steps % (k + 1) if k else 0
            seq.num_steps += 1
            outputs.append(self._commit(seq, 1 + accepted, k, accepted))
        return outputs

    def _commit(self, seq: _Sequence, n: int, num_draft: int, num_accepted: int) -> StepOutput:
        n = min(n, seq.params.max_tokens - len(seq.token_ids))
        start = len(seq.token_ids)
        new_ids = [ord(STUB_TEXT[(start + i) % len(STUB_TEXT)]) for i in range(n)]
        new_text = "".join(map(chr, new_ids))
        seq.token_ids += new_ids
        finish_reason = "length" if len(seq.token_ids) >= seq.params.max_tokens else None
        for stop in seq.params.stop:
            cut = (seq.text + new_text).find(stop)
            if cut >= 0:
                new_text = (seq.text + new_text)[:cut][len(seq.text):]
                finish_reason = "stop"
                break
        seq.text += new_text
        if finish_reason:
            self._running.pop(seq.request_id, None)
        return StepOutput(seq.request_id, new_ids, new_text, finish_reason is not None, finish_reason,
                          num_draft, num_accepted)  # fmt: skip
