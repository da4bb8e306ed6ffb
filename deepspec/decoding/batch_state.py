"""The engine's one record of its running rows (vLLM v1's `InputBatch`): what each slot has committed, and how it
samples.

Before this record every drafter kept its own copy of each sequence's tokens and moved it when the engine
compacted its slots; now the engine writes every committed token once, here, and drafters read it through
`BatchView`, a read-only window. Drafters that only look at the tokens (prompt lookup, corpus lookup) keep no
per-slot state at all: what they cache (an n-gram index) is keyed by `sequence_id`, which stays with a sequence
when the engine moves it to another slot, and is rebuilt from the view whenever the view has moved past it.
Only drafters with KV caches of their own (the neural drafts) still hear each commit (drafter.KVDrafter).

Layout. Slot s holds `token_ids[s, :num_tokens[s]]`: the prompt, then every committed output token, the last one
the `pending` token the target has not yet read. Running rows sit in slots 0..n-1 (the engine's invariant), so the
per-row sampling tensors of a decode round over rows 0..B-1 are prefix slices, already on the target's device:
a round builds only its fresh seeds.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from deepspec.decoding.params import SamplingParams

#: sequence_id of a slot that holds no sequence
NO_SEQUENCE = -1
_sequence_ids = itertools.count()


def new_sequence_id() -> int:
    """A sequence id no other sequence of this process has had: a drafter shared by several engines (an eval, a
    test suite) never mistakes one engine's sequence for another's."""
    return next(_sequence_ids)


class BatchView:
    """What a drafter may read of the engine's rows: each slot's committed tokens, and who lives there."""

    def __init__(self, state: BatchState):
        self._state = state

    def tokens(self, slot: int) -> np.ndarray:
        """The slot's committed tokens (prompt + output), a read-only int64 array valid until the next step."""
        row = self._state.token_ids[slot, : self._state.num_tokens[slot]]
        row.flags.writeable = False
        return row

    def num_tokens(self, slot: int) -> int:
        return int(self._state.num_tokens[slot])

    def last_token(self, slot: int) -> int:
        """The token the next draft follows: the slot's last committed one."""
        return int(self._state.token_ids[slot, self._state.num_tokens[slot] - 1])

    def sequence_id(self, slot: int) -> int:
        """A number that names the slot's sequence for as long as it runs, whichever slot it moves to."""
        return int(self._state.sequence_ids[slot])

    def session(self, slot: int) -> str | None:
        """The session the slot's request drafts from and is remembered in (SamplingParams.session), or None."""
        return self._state.sessions[slot]

    def live_sequence_ids(self) -> set[int]:
        return {int(i) for i in self._state.sequence_ids if i != NO_SEQUENCE}


class BatchState:
    """Token history, lengths, slot → sequence map and per-row sampling tensors of `max_batch_size` slots; written
    only by the engine (SpecEngine), read by drafters through `view`."""

    def __init__(self, max_batch_size: int, max_tokens: int, device: torch.device | str = "cpu"):
        self.max_tokens = max_tokens
        self.token_ids = np.zeros((max_batch_size, max_tokens), dtype=np.int64)
        self.num_tokens = np.zeros(max_batch_size, dtype=np.int64)
        self.sequence_ids = np.full(max_batch_size, NO_SEQUENCE, dtype=np.int64)
        self.sessions: list[str | None] = [None] * max_batch_size
        #: per-row sampling parameters, host and target-device copies (the ops read the latter)
        self.temperature = torch.zeros(max_batch_size, dtype=torch.float32)
        self.top_k = torch.zeros(max_batch_size, dtype=torch.int64)
        self.top_p = torch.ones(max_batch_size, dtype=torch.float32)
        self.device = torch.device(device)
        self._device_sampling = [t.to(self.device) for t in (self.temperature, self.top_k, self.top_p)]
        self.view = BatchView(self)

    # ---- writes (the engine's) --------------------------------------------------------------------------------
    def admit(self, slot: int, sequence_id: int, params: SamplingParams) -> None:
        """A new sequence takes `slot`: no tokens yet (they come with its prefill), its sampling parameters now."""
        self.sequence_ids[slot] = sequence_id
        self.sessions[slot] = params.session
        self.num_tokens[slot] = 0
        self.temperature[slot], self.top_k[slot], self.top_p[slot] = params.temperature, params.top_k, params.top_p
        for host, device in zip((self.temperature, self.top_k, self.top_p), self._device_sampling):
            device[slot] = host[slot]  # one small host-to-device copy per admission, none per round

    def append(self, slot: int, tokens: list[int]) -> None:
        """Committed tokens of the slot's sequence, in order. ValueError past the slot's capacity (never for a
        request the engine validated: its prompt and output fit max_seq_len)."""
        start = int(self.num_tokens[slot])
        if start + len(tokens) > self.max_tokens:
            raise ValueError(f"slot {slot} holds at most {self.max_tokens} tokens; {start} + {len(tokens)} do not fit")
        self.token_ids[slot, start : start + len(tokens)] = tokens
        self.num_tokens[slot] = start + len(tokens)

    def move(self, src: int, dst: int) -> None:
        """The sequence in `src` now lives in `dst` (the engine keeps running rows in slots 0..n-1)."""
        n = int(self.num_tokens[src])
        self.token_ids[dst, :n] = self.token_ids[src, :n]
        self.num_tokens[dst], self.sequence_ids[dst] = n, self.sequence_ids[src]
        self.sessions[dst] = self.sessions[src]
        for t in (self.temperature, self.top_k, self.top_p, *self._device_sampling):
            t[dst] = t[src]
        self.clear(src)

    def clear(self, slot: int) -> None:
        self.num_tokens[slot], self.sequence_ids[slot] = 0, NO_SEQUENCE
        self.sessions[slot] = None

    # ---- reads (the engine's) ---------------------------------------------------------------------------------
    def sampling_params(self, num_rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(temperature, top_k, top_p) of rows 0..num_rows-1 on the target's device: views, no copy."""
        temperature, top_k, top_p = self._device_sampling
        return temperature[:num_rows], top_k[:num_rows], top_p[:num_rows]

    def host_temperature(self, num_rows: int) -> torch.Tensor:
        return self.temperature[:num_rows]
