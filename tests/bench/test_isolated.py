"""A peer in its own process: its crash (SIGILL from a wrongly built llama.cpp) costs its row, not the benchmark."""

import os
import signal

import pytest

from bench.decode import run_interleaved
from bench.isolated import IsolatedDecoder, PeerFailed, describe_exit
from tests.bench import peers


def test_describe_exit_names_the_signal():
    assert describe_exit(-signal.SIGILL) == "crashed: signal 4 (SIGILL)"
    assert describe_exit(-signal.SIGSEGV) == "crashed: signal 11 (SIGSEGV)"
    assert describe_exit(3) == "exited with status 3"


def test_a_healthy_peer_answers_from_its_own_process_with_the_threads_it_was_given():
    before = os.environ.get("OMP_NUM_THREADS")
    decoder = IsolatedDecoder(peers.echo, 7, threads=3)
    try:
        assert os.environ.get("OMP_NUM_THREADS") == before  # the parent's setting is left as it was
        tokens, seconds, threads = decoder([1, 2])
        assert tokens == [7, 1, 2] and seconds >= 0 and threads == "3"
        assert decoder([5])[0] == [7, 5]
        assert decoder.process.pid != os.getpid()
    finally:
        decoder.close()
    assert not decoder.process.is_alive()


def test_a_peer_killed_by_sigill_while_decoding_reports_the_signal():
    decoder = IsolatedDecoder(peers.dies_on, 99)
    assert decoder([1])[0] == [0, 1]
    with pytest.raises(PeerFailed, match=r"^crashed: signal 4 \(SIGILL\)$"):
        decoder([1, 99])
    decoder.close()


def test_a_peer_that_dies_or_raises_while_loading_fails_at_start():
    with pytest.raises(PeerFailed, match=r"^crashed: signal 11 \(SIGSEGV\)$"):
        IsolatedDecoder(peers.dies_while_loading)
    with pytest.raises(PeerFailed, match="failed to start: FileNotFoundError: no such model.gguf"):
        IsolatedDecoder(peers.raises_while_loading)


def test_one_crashing_peer_costs_its_row_and_the_other_methods_finish():
    crashing = IsolatedDecoder(peers.dies_on, 99)
    decoders = {"engine": peers.echo(1), "llama.cpp": crashing, "hf-generate": peers.echo(2)}
    prompts = {"humaneval": [[10], [11]], "gsm8k": [[99], [12]]}  # the peer dies on the third prompt
    try:
        rows, failed = run_interleaved(decoders, prompts, lambda message: None)
    finally:
        crashing.close()
    assert failed == {"llama.cpp": "crashed: signal 4 (SIGILL)"}
    assert set(rows) == {"engine", "hf-generate"}
    assert [r[0] for r in rows["engine"]["humaneval"] + rows["engine"]["gsm8k"]] == [[1, 10], [1, 11], [1, 99], [1, 12]]
    assert [r[0] for r in rows["hf-generate"]["gsm8k"]] == [[2, 99], [2, 12]]
