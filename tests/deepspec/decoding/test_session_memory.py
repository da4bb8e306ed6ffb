"""Session memory (deepspec/decoding/session_memory.py): a session's earlier answers draft its next requests, never
another session's; bounded; greedy output unchanged."""

from __future__ import annotations

import pytest

from deepspec.decoding.drafters.prompt_lookup import PromptLookupDrafter
from deepspec.decoding.engine import SpecEngine
from deepspec.decoding.params import SamplingParams
from deepspec.decoding.session_memory import SessionMemory
from deepspec.decoding.validation import RequestError
from tests.training.helpers import tiny_target

#: a prompt with no repeats of its own: what prompt lookup drafts for it can only come from memory
PROMPT = [5, 17, 3, 29, 11, 42, 8]


@pytest.fixture(scope="module")
def target():
    return tiny_target()


def test_memory_drafts_what_followed_the_longest_recent_match_and_stops_at_an_answer_end():
    memory = SessionMemory(min_ngram=2, max_ngram=4)
    memory.add("k1:alice", [1, 2, 3, 4, 5, 6])
    memory.add("k1:alice", [9, 2, 3, 7, 8])  # a later answer with the same bigram 2 3
    assert memory.draft("k1:alice", [0, 2, 3], 3) == [7, 8]  # the latest occurrence; not past its answer's end
    assert memory.draft("k1:alice", [1, 2, 3], 3) == [4, 5, 6]  # a longer match wins over a recent short one
    assert memory.draft("k1:alice", [7, 7], 3) == []


def test_sessions_never_share_memory():
    memory = SessionMemory()
    memory.add("key-a:session-1", [1, 2, 3, 4])
    assert memory.draft("key-a:session-1", [1, 2], 2) == [3, 4]
    assert memory.draft("key-b:session-1", [1, 2], 2) == []  # the same client session id under another API key
    assert memory.draft("key-a:session-2", [1, 2], 2) == []


def test_memory_is_bounded_in_sessions_and_tokens():
    memory = SessionMemory(max_sessions=2, max_tokens_per_session=6)
    memory.add("a", [1, 2, 3, 4])
    memory.add("b", [5, 6])
    memory.draft("a", [1, 2], 1)  # a is used: b is now the least recently used
    memory.add("c", [7, 8])
    assert len(memory) == 2 and memory.draft("b", [5], 1) == [] and memory.draft("a", [1, 2], 1) == [3]
    memory.add("a", [10, 11, 12, 13])  # 8 tokens > 6: the oldest answer goes
    assert memory.num_tokens("a") == 4 and memory.draft("a", [1, 2], 1) == []
    assert memory.draft("a", [10, 11], 2) == [12, 13]
    assert memory.forget("a") and not memory.forget("a") and memory.num_tokens("a") == 0
    with pytest.raises(ValueError):
        SessionMemory(max_sessions=0)


def test_a_session_key_is_validated():
    with pytest.raises(RequestError):
        SamplingParams(session="")
    with pytest.raises(RequestError):
        SamplingParams(session=7)  # pyright: ignore[reportArgumentType]  # the bad input under test


def _run(engine, session):
    params = SamplingParams(max_tokens=24, ignore_eos=True, session=session)
    return engine.generate([PROMPT], params)[0]


def test_a_repeated_request_drafts_its_earlier_answer_only_within_its_session(target):
    engine = SpecEngine(
        target,
        PromptLookupDrafter(min_ngram=2, max_ngram=3),
        max_batch_size=2,
        max_seq_len=128,
        num_speculative_tokens=4,
    )
    reference = (
        SpecEngine(target, None, max_batch_size=1, max_seq_len=128)
        .generate([PROMPT], SamplingParams(max_tokens=24, ignore_eos=True))[0]
        .token_ids
    )
    first = _run(engine, "key-a:s1")
    again = _run(engine, "key-a:s1")
    other_key = _run(engine, "key-b:s1")
    no_session = _run(engine, None)
    assert first.token_ids == again.token_ids == other_key.token_ids == no_session.token_ids == reference
    # the second request of the session drafts from its first answer where its own context matches less, and takes
    # fewer rounds for the same tokens; under another key, or without a session, nothing is remembered
    assert again.num_steps <= first.num_steps - 3 and again.num_accepted_tokens > first.num_accepted_tokens
    assert (other_key.num_steps, other_key.num_accepted_tokens) == (first.num_steps, first.num_accepted_tokens)
    assert (no_session.num_steps, no_session.num_accepted_tokens) == (first.num_steps, first.num_accepted_tokens)
    assert engine.session_memory.num_tokens("key-a:s1") == 48 and len(engine.session_memory) == 2
