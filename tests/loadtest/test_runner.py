"""The runner: closed and open loops, bounds, warm-up exclusion, Ctrl-C (the stop event), spec-decode diff."""

import asyncio
import time
from typing import cast

import pytest

from loadtest.arrivals import LoadPoint
from loadtest.clients import Client
from loadtest.clients.openai_http import OpenAIHttpClient
from loadtest.fake_server import FakeOpenAIServer, FakeServerConfig
from loadtest.runner import Progress, run_load, run_point
from loadtest.workload import random_requests
from tests.ports import free_port


def reqs(output_len=4):
    return random_requests(input_len=4, output_len=output_len, range_ratio=0.0, seed=0, ignore_eos=True)


def client_factory(url):
    return lambda pool: OpenAIHttpClient(url, chat=False, model=None, pool_size=pool)


def test_closed_loop_keeps_exactly_n_in_flight_and_warmup_is_excluded():
    async def go():
        async with FakeOpenAIServer(FakeServerConfig(ttft_s=0.02)) as srv:
            res = await run_point(
                client_factory(srv.url),
                reqs(),
                LoadPoint(max_concurrency=8),
                num_requests=40,
                num_warmups=5,
                metrics_url=srv.url + "/metrics",
            )
            return res, srv.counters

    res, counters = asyncio.run(go())
    assert counters.requests == 45  # the server saw the warm-up ...
    assert len(res.run.outputs) == 40 and all(o.success for o in res.run.outputs)  # ... the report does not
    assert res.run.max_concurrent_requests == 8 and counters.max_in_flight == 8
    # 40 requests, 8 at a time, >= 20 ms each: at least 5 rounds (the upper bound allows for a busy machine).
    assert 0.1 <= res.run.duration_s < 2.0
    # warm-up happened before the first scrape: the diff covers the 40 measured requests only.
    assert res.spec_decode is not None and res.spec_decode.num_drafts == 40 * 4


def test_open_loop_poisson_rate_and_request_count():
    async def go():
        async with FakeOpenAIServer() as srv, OpenAIHttpClient(srv.url, chat=False, model=None) as c:
            return await run_load(c, reqs(), LoadPoint(request_rate=100.0), num_requests=60, seed=3)

    run = asyncio.run(go())
    assert len(run.outputs) == 60 and all(o.success for o in run.outputs)
    # 59 exponential gaps of mean 10 ms: ~0.59 s; 5 standard deviations (~0.38 s) below, a busy machine above.
    assert 0.2 < run.duration_s < 2.5
    starts = sorted(o.start_time for o in run.outputs)
    assert starts[-1] - starts[0] == pytest.approx(run.duration_s, abs=0.05)


def test_duration_bounds_sending_and_in_flight_requests_finish():
    async def go():
        async with (
            FakeOpenAIServer(FakeServerConfig(ttft_s=0.1)) as srv,
            OpenAIHttpClient(srv.url, chat=False, model=None) as c,
        ):
            return await run_load(c, reqs(), LoadPoint(request_rate=40.0), num_requests=None, duration_s=0.5)

    run = asyncio.run(go())
    assert 8 <= len(run.outputs) <= 40  # Poisson(20) sends
    assert all(o.success for o in run.outputs) and not run.interrupted
    assert run.duration_s >= 0.1  # the last request sent before 0.5 s was waited for


def test_max_concurrency_caps_an_open_loop():
    async def go():
        async with FakeOpenAIServer(FakeServerConfig(ttft_s=0.05)) as srv:
            async with OpenAIHttpClient(srv.url, chat=False, model=None, pool_size=3) as c:
                run = await run_load(c, reqs(), LoadPoint(request_rate=1000.0, max_concurrency=3), num_requests=12)
            return run, srv.counters.max_in_flight

    run, server_max = asyncio.run(go())
    assert len(run.outputs) == 12 and run.max_concurrent_requests == 3 and server_max == 3


def test_stop_returns_a_partial_run_and_cancels_in_flight():
    async def go():
        stop = asyncio.Event()
        progress = Progress()
        async with (
            FakeOpenAIServer(FakeServerConfig(ttft_s=0.05, itl_s=0.05)) as srv,
            OpenAIHttpClient(srv.url, chat=False, model=None) as c,
        ):
            asyncio.get_running_loop().call_later(0.4, stop.set)
            t = time.perf_counter()
            run = await run_load(
                c, reqs(output_len=6), LoadPoint(max_concurrency=4), num_requests=1000, stop=stop, progress=progress
            )
            return run, time.perf_counter() - t, progress

    run, wall, progress = asyncio.run(go())
    assert run.interrupted and wall < 3.0
    assert run.num_cancelled == 4  # the four in flight at the stop
    assert 4 <= len(run.outputs) < 1000 and all(o.success for o in run.outputs)
    assert progress.completed == len(run.outputs) and progress.in_flight == 0


def test_errors_are_counted_and_the_run_goes_on():
    async def go():
        async with OpenAIHttpClient(f"http://127.0.0.1:{free_port()}", chat=False, model=None) as c:
            return await run_load(c, reqs(), LoadPoint(max_concurrency=2), num_requests=6)

    run = asyncio.run(go())
    assert len(run.outputs) == 6 and {o.error_kind for o in run.outputs} == {"connect"}


def test_spec_decode_statistics_from_server_counters():
    async def go():
        cfg = FakeServerConfig(tokens_per_chunk=3, num_speculative_tokens=4)
        async with FakeOpenAIServer(cfg) as srv:
            return await run_point(
                client_factory(srv.url),
                reqs(output_len=12),
                LoadPoint(max_concurrency=2),
                num_requests=10,
                metrics_url=srv.url + "/metrics",
            )

    sd = asyncio.run(go()).spec_decode
    assert sd is not None
    # 12 tokens in steps of 3 (2 accepted drafts + the bonus token) -> 4 steps per request, k = 4 drafted per step.
    assert (sd.num_drafts, sd.num_draft_tokens, sd.num_accepted_tokens) == (40, 160, 80)
    assert sd.acceptance_length == pytest.approx(3.0) and sd.acceptance_rate == pytest.approx(0.5)
    assert sd.per_position_acceptance_rate == pytest.approx([1.0, 1.0, 0.0, 0.0])


def test_unreachable_metrics_url_is_a_note_not_a_failure():
    async def go():
        async with FakeOpenAIServer() as srv:
            return await run_point(
                client_factory(srv.url),
                reqs(),
                LoadPoint(max_concurrency=1),
                num_requests=2,
                metrics_url=f"http://127.0.0.1:{free_port()}/metrics",
            )

    res = asyncio.run(go())
    assert (
        res.spec_decode is None
        and res.spec_decode_note is not None
        and "scrape" in res.spec_decode_note
        and len(res.run.outputs) == 2
    )


def test_unbounded_run_is_refused():
    with pytest.raises(ValueError, match="bound"):
        # no client: the bound is checked before anything is sent
        asyncio.run(run_load(cast(Client, None), reqs(), LoadPoint(), num_requests=None))
