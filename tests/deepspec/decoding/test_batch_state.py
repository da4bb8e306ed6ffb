"""The engine's batch state (deepspec/decoding/batch_state.py, after vLLM v1's `InputBatch`): the one record of each
running row's committed tokens, its sequence and its sampling parameters, kept right through continuous batching
(requests finishing in any order make the engine move rows to keep them in slots 0..n-1)."""

from __future__ import annotations

import pytest
import torch

from deepspec.decoding.batch_state import NO_SEQUENCE, BatchState
from deepspec.decoding.drafters.prompt_lookup import PromptLookupDrafter
from deepspec.decoding.engine import SpecEngine
from deepspec.decoding.params import SamplingParams
from tests.conftest import make_tiny_target

PROMPTS = [[1, 2, 3, 1, 2, 3, 4], [5, 6, 7, 5, 6, 7], [8, 9, 10, 11], [3, 3, 4, 3, 3], [2, 4, 6, 2, 4]]


def _check_rows(engine: SpecEngine) -> None:
    """Every prefilled row's record equals its sequence: tokens, id, sampling; free slots hold nothing."""
    state, view = engine.batch_state, engine.batch_state.view
    temperature, top_k, top_p = state.sampling_params(engine.max_batch_size)
    held = set()
    for seq in engine._running:
        assert view.sequence_id(seq.slot) == seq.sequence_id
        held.add(seq.slot)
        if seq.prefilled:
            assert view.tokens(seq.slot).tolist() == seq.prompt + seq.output
            assert view.last_token(seq.slot) == seq.pending
        p = seq.params
        assert (float(temperature[seq.slot]), int(top_k[seq.slot]), float(top_p[seq.slot])) == pytest.approx(
            (p.temperature, p.top_k, p.top_p)
        )
    for slot in set(range(engine.max_batch_size)) - held:
        assert view.sequence_id(slot) == NO_SEQUENCE and view.num_tokens(slot) == 0


def test_the_batch_state_follows_every_row_through_finishes_and_moves():
    target = make_tiny_target()[0]
    engine = SpecEngine(target, PromptLookupDrafter(), max_batch_size=4, max_seq_len=96, num_speculative_tokens=3)
    params = [
        SamplingParams(max_tokens=n, temperature=t, top_k=k, top_p=p, seed=i)
        for i, (n, t, k, p) in enumerate(
            [(3, 0.0, 0, 1.0), (20, 0.7, 5, 0.9), (9, 1.0, 0, 0.5), (14, 0.0, 0, 1.0), (6, 1.3, 3, 1.0)]
        )
    ]
    queue = [(str(i), p, q) for i, (p, q) in enumerate(zip(PROMPTS, params))]
    moves = 0
    engine_move = engine._move

    def counting_move(src, dst):
        nonlocal moves
        moves += 1
        engine_move(src, dst)

    engine._move = counting_move
    while queue or engine.has_unfinished():
        while queue and engine.num_free_slots:
            engine.add_request(*queue.pop(0))
        engine.step()
        _check_rows(engine)
    assert moves > 0  # the requests finish out of slot order, so rows were moved


def test_sequence_ids_are_unique_across_engines():
    """A drafter shared by two engines tells their sequences apart by id: no id repeats in a process."""
    target = make_tiny_target()[0]
    ids = []
    for _ in range(2):
        engine = SpecEngine(target, None, max_batch_size=2, max_seq_len=64)
        engine.add_request("a", PROMPTS[0], SamplingParams(max_tokens=2))
        engine.add_request("b", PROMPTS[1], SamplingParams(max_tokens=2))
        ids += [engine.batch_state.view.sequence_id(s) for s in (0, 1)]
    assert len(set(ids)) == 4


def test_a_slot_refuses_tokens_past_its_capacity():
    state = BatchState(2, 4)
    state.admit(0, 7, SamplingParams())
    state.append(0, [1, 2, 3])
    with pytest.raises(ValueError, match="at most 4 tokens"):
        state.append(0, [4, 5])
    assert state.view.tokens(0).tolist() == [1, 2, 3]  # nothing half-written


def test_the_view_is_read_only():
    state = BatchState(1, 4)
    state.admit(0, 1, SamplingParams())
    state.append(0, [1, 2])
    with pytest.raises(ValueError):
        state.view.tokens(0)[0] = 9


def test_a_move_carries_tokens_id_and_sampling_and_frees_the_source():
    state = BatchState(3, 8)
    state.admit(2, 11, SamplingParams(temperature=0.5, top_k=4, top_p=0.8))
    state.append(2, [4, 5, 6])
    state.move(2, 0)
    assert state.view.tokens(0).tolist() == [4, 5, 6] and state.view.sequence_id(0) == 11
    assert torch.allclose(torch.stack([t[0].float() for t in state.sampling_params(3)]), torch.tensor([0.5, 4.0, 0.8]))
    assert state.view.sequence_id(2) == NO_SEQUENCE and state.view.num_tokens(2) == 0
    assert state.view.live_sequence_ids() == {11}
