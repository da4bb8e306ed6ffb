"""Drive one load point: warm up, scrape counters, send requests on schedule, collect outputs.

The runner is the only place that knows about time and cancellation; the clients only time their own
request, and `metrics.py` only does arithmetic. It never prints: it updates a `Progress` that the CLI renders.

Bounds: `num_requests` and/or `duration_s`. The duration bounds when requests are *sent*; requests in flight
when it expires are allowed to finish (up to the client timeout), so every measured request is complete.
Stopping: setting `stop` (the CLI does it on Ctrl-C) stops sending, cancels the requests in flight and
returns what finished so far with `interrupted=True`; cancelled requests are counted apart, not as errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from loadtest import spec_stats
from loadtest.arrivals import LoadPoint, arrival_offsets
from loadtest.clients import Client
from loadtest.records import RequestInput, RequestOutput

#: gaps shorter than this are slept without watching `stop` (cheaper at hundreds of requests/s).
_SHORT_SLEEP_S = 0.05


@dataclass(slots=True)
class Progress:
    """Live counters, written by the runner and read by the display at its own pace."""

    phase: str = "idle"  # "warm-up" | "run" | "idle"
    total: int | None = None
    duration_s: float | None = None
    start_time: float = 0.0
    sent: int = 0
    completed: int = 0
    failed: int = 0
    in_flight: int = 0
    output_tokens: int = 0

    def reset(self, phase: str, total: int | None, duration_s: float | None) -> None:
        self.phase, self.total, self.duration_s = phase, total, duration_s
        self.start_time = time.perf_counter()
        self.sent = self.completed = self.failed = self.in_flight = self.output_tokens = 0


@dataclass(slots=True)
class RunResult:
    outputs: list[RequestOutput]
    #: first send -> last response (or -> the stop, when interrupted), seconds.
    duration_s: float
    interrupted: bool = False
    num_cancelled: int = 0
    max_concurrent_requests: int = 0


@dataclass(slots=True)
class PointResult:
    """One load point's measured run plus what was scraped around it."""

    point: LoadPoint
    run: RunResult
    spec_decode: spec_stats.SpecDecodeStats | None = None
    #: why spec-decode statistics are missing, when they are ("scrape failed: ..."); None otherwise.
    spec_decode_note: str | None = None
    num_warmups: int = 0
    extra: dict = field(default_factory=dict)


async def run_load(
    client: Client,
    requests: Iterator[RequestInput],
    point: LoadPoint,
    *,
    num_requests: int | None,
    duration_s: float | None = None,
    seed: int = 0,
    stop: asyncio.Event | None = None,
    progress: Progress | None = None,
) -> RunResult:
    """Send requests at `point`'s schedule until a bound is hit or `stop` is set."""
    if num_requests is None and duration_s is None:
        raise ValueError("bound the run: give num_requests and/or duration_s")
    stop = stop or asyncio.Event()
    progress = progress or Progress()
    t0 = time.perf_counter()
    deadline = t0 + duration_s if duration_s is not None else math.inf
    sender = _Sender(client, requests, stop, progress, num_requests, t0, deadline)
    if math.isinf(point.request_rate) and point.max_concurrency:
        sender.start_closed_loop(point.max_concurrency)
    else:
        await sender.open_loop(point, seed)
    await _wait_or_stop(sender.tasks, stop)
    interrupted = stop.is_set()
    end = time.perf_counter() if interrupted or not sender.outputs else sender.last_done
    return RunResult(
        outputs=sender.outputs,
        duration_s=end - t0,
        interrupted=interrupted,
        num_cancelled=sender.cancelled,
        max_concurrent_requests=sender.max_in_flight,
    )


@dataclass(slots=True)
class _Sender:
    """One run's sending: its bounds, the requests in flight and the outputs, shared by the open and closed loops."""

    client: Client
    requests: Iterator[RequestInput]
    stop: asyncio.Event
    progress: Progress
    num_requests: int | None
    t0: float
    #: no request is sent at or after this perf_counter time (inf without a duration bound).
    deadline: float
    outputs: list[RequestOutput] = field(default_factory=list)
    tasks: set[asyncio.Task] = field(default_factory=set)
    #: requests sent so far (the bound `num_requests` counts these).
    count: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    cancelled: int = 0
    #: perf_counter time the last request finished; the run's end when it was not interrupted.
    last_done: float = 0.0

    def may_send(self) -> bool:
        return (
            not self.stop.is_set()
            and (self.num_requests is None or self.count < self.num_requests)
            and time.perf_counter() < self.deadline
        )

    async def send(self, req: RequestInput) -> None:
        """Send one request and record its output; a cancelled one is counted apart and leaves no output."""
        self.in_flight += 1
        self.progress.in_flight += 1
        self.progress.sent += 1
        if self.in_flight > self.max_in_flight:
            self.max_in_flight = self.in_flight
        try:
            out = await self.client.send(req)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.in_flight -= 1
            self.progress.in_flight -= 1
        self.last_done = time.perf_counter()
        self.outputs.append(out)
        if out.success:
            self.progress.completed += 1
            self.progress.output_tokens += out.output_tokens
        else:
            self.progress.failed += 1

    def start_closed_loop(self, workers: int) -> None:
        """Closed loop: `workers` tasks, each sends its next request as soon as its last one ends."""
        self.tasks = {asyncio.create_task(self._closed_loop_worker()) for _ in range(workers)}

    async def _closed_loop_worker(self) -> None:
        while self.may_send():
            self.count += 1
            await self.send(next(self.requests))

    async def open_loop(self, point: LoadPoint, seed: int) -> None:
        """Open loop: send each request at its arrival time (capped at `point.max_concurrency` in flight, if set)."""
        sem = asyncio.Semaphore(point.max_concurrency) if point.max_concurrency else None
        offsets = arrival_offsets(point.request_rate, point.burstiness, random.Random(seed))
        while self.may_send():
            send_at = self.t0 + next(offsets)
            if send_at >= self.deadline:
                break
            delay = send_at - time.perf_counter()
            if delay > 0:
                await self._sleep_unless_stopped(delay)
                if not self.may_send():
                    break
            self.count += 1
            req = next(self.requests)
            task = asyncio.create_task(self._send_capped(req, sem) if sem else self.send(req))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _sleep_unless_stopped(self, delay: float) -> None:
        if delay < _SHORT_SLEEP_S:
            await asyncio.sleep(delay)  # a plain timer: a stop waits at most this long
        else:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stop.wait(), delay)

    async def _send_capped(self, req: RequestInput, sem: asyncio.Semaphore) -> None:
        async with sem:
            if self.stop.is_set():
                return
            await self.send(req)


async def _wait_or_stop(tasks: set[asyncio.Task], stop: asyncio.Event) -> None:
    """Wait for `tasks`; if `stop` is set first, cancel what is left and wait for the cancellations."""
    pending = set(tasks)
    if not pending:
        return
    stopper = asyncio.create_task(stop.wait())
    try:
        while pending and not stop.is_set():
            _, pending = await asyncio.wait(pending | {stopper}, return_when=asyncio.FIRST_COMPLETED)
            pending.discard(stopper)
    finally:
        stopper.cancel()
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


async def run_point(
    make_client: Callable[[int], Client],
    requests: Iterator[RequestInput],
    point: LoadPoint,
    *,
    num_requests: int | None,
    duration_s: float | None = None,
    num_warmups: int = 0,
    metrics_url: str | None = None,
    seed: int = 0,
    stop: asyncio.Event | None = None,
    progress: Progress | None = None,
) -> PointResult:
    """Warm up (results dropped), scrape `metrics_url`, run the measured requests, scrape again.

    `make_client(pool_size)` builds a fresh client whose pool fits this point (0 = unbounded)."""
    stop = stop or asyncio.Event()
    progress = progress or Progress()
    client = make_client(point.max_concurrency or 0)
    await client.start()
    try:
        if num_warmups:
            progress.reset("warm-up", num_warmups, None)
            warm = LoadPoint(max_concurrency=min(num_warmups, point.max_concurrency or num_warmups))
            await run_load(client, requests, warm, num_requests=num_warmups, stop=stop, progress=progress)
        before, note = await _scrape(metrics_url)
        progress.reset("run", num_requests, duration_s)
        run = await run_load(
            client,
            requests,
            point,
            num_requests=num_requests,
            duration_s=duration_s,
            seed=seed,
            stop=stop,
            progress=progress,
        )
        progress.phase = "idle"
        stats = None
        if before is not None:
            after, note = await _scrape(metrics_url)
            if after is not None:
                stats = spec_stats.diff(before, after)
                if stats is None:
                    note = "the server exports no deepspec:spec_decode_* counters"
    finally:
        await client.aclose()
    return PointResult(point=point, run=run, spec_decode=stats, spec_decode_note=note, num_warmups=num_warmups)


async def _scrape(url: str | None) -> tuple[spec_stats.SpecCounters | None, str | None]:
    if not url:
        return None, "disabled"
    try:
        text = await asyncio.to_thread(spec_stats.scrape, url)
    except Exception as e:
        return None, f"scrape of {url} failed: {type(e).__name__}: {e}"
    try:
        return spec_stats.parse_counters(text), None
    except ValueError as e:
        return None, f"{url} is not Prometheus text: {e}"
