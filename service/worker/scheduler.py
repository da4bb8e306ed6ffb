"""Continuous batching: one engine thread steps the engine; asyncio callers submit requests and read their outputs.

The engine is blocking, CPU-bound and not thread-safe, so exactly one thread (`deepspec-engine`) touches it. Between
two steps that thread drains a command queue (add / abort), admits waiting requests into free batch slots, and then
runs one `engine.step()`; requests therefore join and leave the running batch at step boundaries. Waiting requests
are bounded by `max_queue`: beyond that `generate` raises `QueueFullError` at once (the gateway retries elsewhere or
answers 429). Outputs go back to the caller's event loop with one `call_soon_threadsafe` per step.

A request may ask for n sequences from its prompt (OpenAI's `n`): they are admitted together, the first as the
engine request and the others as its forks (`SpecEngine.add_request(fork_of=...)`: one prefill, KV copied), each
with its own seed (seed + i when the request has one, as vLLM's child requests), and their outputs come back on one
stream tagged with the sequence index. Metrics count each sequence as a request, except that the prompt's tokens
are counted once (they were computed once).

A caller that stops iterating (client gone, stream closed, task cancelled) sends an abort, which frees the slot
before the next step. Worker-side metrics (queue time, TTFT, inter-token latency, spec-decode counters, running and
waiting gauges) are observed here, where the step outputs are produced.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

from deepspec.decoding.params import SamplingParams, StepOutput
from deepspec_protocol.worker import DEFAULT_SERVICE_CLASS, SERVICE_CLASSES, RequestStats
from service.worker.load import LoadTracker

logger = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """Every batch slot is busy and the waiting queue is full."""


class SchedulerClosedError(RuntimeError):
    """The worker is draining or stopped and takes no new requests."""


@dataclass
class _Request:
    """One sequence in the engine: a caller's request, or one of its n sequences (`index`, sharing `outputs`)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival: float
    loop: asyncio.AbstractEventLoop
    outputs: asyncio.Queue
    index: int = 0
    first_token: float | None = None
    last_token: float | None = None
    #: cumulative counts, replaced (frozen) after each step that produced output for this request
    stats: RequestStats = field(default_factory=RequestStats)
    #: set by the engine thread once the request left the engine (finished, failed or aborted)
    done: bool = field(default=False)
    #: the service class the gateway admitted it under (deepspec_protocol/worker.py SERVICE_CLASSES): labels its
    #: acceptance metrics
    service_class: str = DEFAULT_SERVICE_CLASS


def class_priority(service_class: str) -> int:
    """The engine's scheduling priority of a service class (SamplingParams.priority: lower first), by its place in
    SERVICE_CLASSES; an unknown class is scheduled as the default one."""
    return SERVICE_CLASSES.index(service_class if service_class in SERVICE_CLASSES else DEFAULT_SERVICE_CLASS)


def _sequence_params(params: SamplingParams, index: int) -> SamplingParams:
    """Sequence `index`'s parameters: its own seed, seed + index (vllm/v1/engine/parallel_sampling.py)."""
    return params if index == 0 or params.seed is None else replace(params, seed=params.seed + index)


class Scheduler:
    def __init__(self, engine, metrics, max_queue: int = 64, max_prefill_tokens_per_step: int = 512):
        self.engine = engine
        self.metrics = metrics
        self.max_queue = max_queue
        self.max_prefill_tokens_per_step = max_prefill_tokens_per_step
        #: ("add" | "abort", a request's group of sequences) or ("wake", None), from the event loop to the engine
        #: thread
        self._commands: queue.SimpleQueue[tuple[str, list[_Request] | None]] = queue.SimpleQueue()
        #: the groups (a request's n sequences) waiting for slots, first come first
        self._waiting: deque[list[_Request]] = deque()
        self._running: dict[str, _Request] = {}
        self._num_waiting = 0  # submitted, not yet admitted; guarded by _lock (read by callers)
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.accepting = True
        #: the load the worker publishes to the gateway (slots, queue, speed, acceptance per class)
        self.load = LoadTracker(engine.max_batch_size, engine.max_batch_size * getattr(engine, "max_seq_len", 0))

    # -- caller side (event loop) ---------------------------------------------------------------------------------

    @property
    def num_outstanding(self) -> int:
        with self._lock:
            return self._num_waiting + len(self._running)

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival: float | None = None,
        n: int = 1,
        service_class: str = DEFAULT_SERVICE_CLASS,
    ) -> AsyncIterator[tuple[StepOutput, RequestStats, int]]:
        """Yield (step output, that sequence's cumulative stats, sequence index) until all `n` sequences finish.
        Bad input raises the engine's RequestError here, before the request queues (the engine's validate reads
        only fixed settings); ValueError when n does not fit the batch."""
        if not self.accepting:
            raise SchedulerClosedError("the worker is shutting down")
        self.engine.validate(prompt_token_ids, params)
        params = replace(params, priority=class_priority(service_class))
        if not 1 <= n <= self.engine.max_batch_size:
            raise ValueError(
                f"n = {n} sequences do not fit this worker's batch of {self.engine.max_batch_size} "
                f"(--max-batch-size): ask for 1 to {self.engine.max_batch_size}"
            )
        with self._lock:
            if self._num_waiting >= self.max_queue:
                raise QueueFullError(
                    f"the batch is full and {self._num_waiting} requests are waiting (--max-queue {self.max_queue}); "
                    "retry later"
                )
            self._num_waiting += 1
        request_id, outputs = f"r{next(self._ids)}", asyncio.Queue()
        group = [
            _Request(
                request_id=request_id if i == 0 else f"{request_id}.{i}",
                prompt_token_ids=prompt_token_ids,
                params=_sequence_params(params, i),
                arrival=arrival if arrival is not None else time.perf_counter(),
                loop=asyncio.get_running_loop(),
                outputs=outputs,
                index=i,
                stats=RequestStats(num_prompt_tokens=len(prompt_token_ids)),
                service_class=service_class,
            )
            for i in range(n)
        ]
        self._commands.put(("add", group))
        unfinished = n
        try:
            while unfinished:
                item = await outputs.get()
                if isinstance(item, BaseException):
                    unfinished = 0
                    raise item
                unfinished -= item[0].finished
                yield item
        finally:
            if unfinished:
                self._commands.put(("abort", group))

    # -- lifecycle ----------------------------------------------------------------------------------------------

    def start(self, warmup_prompt_token_ids: list[int] | None = None) -> threading.Event:
        """Start the engine thread; the returned event is set after the warm-up step (readiness)."""
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(warmup_prompt_token_ids, ready), name="deepspec-engine", daemon=True
        )
        self._thread.start()
        return ready

    def stop(self, timeout_s: float = 5.0) -> None:
        self.accepting = False
        self._stop.set()
        self._commands.put(("wake", None))
        if self._thread is not None:
            self._thread.join(timeout_s)

    # -- engine thread ---------------------------------------------------------------------------------------------

    def _run(self, warmup_prompt_token_ids, ready: threading.Event) -> None:
        if warmup_prompt_token_ids:
            t0 = time.perf_counter()
            self.engine.add_request("warmup", warmup_prompt_token_ids, SamplingParams(max_tokens=2, ignore_eos=True))
            while self.engine.has_unfinished():
                self.engine.step()
            self.engine.forget_acceptance()  # the warm-up is not traffic: not the budget's prior
            logger.info("warm-up done in %.2f s", time.perf_counter() - t0)
        ready.set()
        while not self._stop.is_set():
            self._drain_commands(block=not self.engine.has_unfinished() and not self._waiting)
            self._admit()
            self._update_gauges()
            if self.engine.has_unfinished():
                self._step()
                self._update_gauges()  # before blocking for commands, so an idle worker reads 0
        for request in [*(group[0] for group in self._waiting), *self._running.values()]:
            self._deliver([(request, SchedulerClosedError("the worker stopped"))])

    def _drain_commands(self, block: bool) -> None:
        try:
            command, request = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            if command == "add" and request is not None:
                self._enqueue(request)
            elif command == "abort" and request is not None:
                self._abort(request)
            try:
                command, request = self._commands.get_nowait()
            except queue.Empty:
                return

    def _enqueue(self, group: list[_Request]) -> None:
        """Queue a request's group behind every waiting one of its priority or a lower one (its service class's:
        interactive before standard before batch), so a flood of batch requests never holds an interactive one."""
        priority = group[0].params.priority
        later = (i for i, waiting in enumerate(self._waiting) if waiting[0].params.priority > priority)
        self._waiting.insert(next(later, len(self._waiting)), group)

    def _abort(self, group: list[_Request]) -> None:
        if any(waiting is group for waiting in self._waiting):
            self._waiting.remove(group)
            with self._lock:
                self._num_waiting -= 1
        for request in group:
            if request.done:
                continue
            if self._running.pop(request.request_id, None) is not None:
                self.engine.abort(request.request_id)
            request.done = True
            self._observe_finished(request, "abort")

    def _admit(self) -> None:
        """Fill free slots (a request's n sequences together), but prefill at most `max_prefill_tokens_per_step`
        prompt tokens per step (at least one request): a burst of arrivals then gets its first tokens in waves
        instead of all after every prefill."""
        failed = []
        num_prefill_tokens = 0
        while self._waiting and self.engine.num_free_slots >= len(self._waiting[0]):
            num_tokens = len(self._waiting[0][0].prompt_token_ids)
            if num_prefill_tokens and num_prefill_tokens + num_tokens > self.max_prefill_tokens_per_step:
                break
            num_prefill_tokens += num_tokens
            group = self._waiting.popleft()
            with self._lock:
                self._num_waiting -= 1
            try:
                for request in group:
                    self.engine.add_request(
                        request.request_id,
                        request.prompt_token_ids,
                        request.params,
                        fork_of=group[0].request_id if request.index else None,
                    )
                    self._running[request.request_id] = request
            except ValueError as e:  # the engine's RequestError (validated at submit; a request id clash here)
                self._abort_added(group)
                failed.append((group[0], e))
                for request in group:
                    self._observe_finished(request, "invalid_request")
                continue
            self.metrics.request_queue_time.labels(self.metrics.model).observe(time.perf_counter() - group[0].arrival)
        if failed:
            self._deliver(failed)

    def _abort_added(self, group: list[_Request]) -> None:
        """Take back the sequences of a group the engine already took when a later one was refused."""
        for request in group:
            if self._running.pop(request.request_id, None) is not None:
                self.engine.abort(request.request_id)
            request.done = True

    def _step(self) -> None:
        started = time.perf_counter()
        try:
            outputs = self.engine.step()
        except Exception as e:  # the engine is broken for this batch: fail its requests, keep the worker alive
            logger.exception("engine step failed")
            failed = []
            for request in self._running.values():
                self.engine.abort(request.request_id)
                request.done = True
                self._observe_finished(request, "error")
                failed.append((request, RuntimeError(f"engine step failed: {e}")))
            self._running.clear()
            self._deliver(failed)
            return
        now = time.perf_counter()
        m, model = self.metrics, self.metrics.model
        self.load.observe_step(len(outputs), sum(len(out.new_token_ids) for out in outputs), now - started)
        items = []
        for out in outputs:
            request = self._running.get(out.request_id)
            if request is None:  # aborted while the step ran
                continue
            if request.first_token is None:
                request.first_token = now
                m.time_to_first_token.labels(model).observe(now - request.arrival)
            else:
                assert request.last_token is not None  # set with first_token, a step before
                m.inter_token_latency.labels(model).observe(now - request.last_token)
            request.last_token = now
            stats = request.stats
            request.stats = stats = replace(
                stats,
                num_output_tokens=stats.num_output_tokens + len(out.new_token_ids),
                num_draft_tokens=stats.num_draft_tokens + out.num_draft_tokens,
                num_accepted_tokens=stats.num_accepted_tokens + out.num_accepted_tokens,
                num_spec_steps=stats.num_spec_steps + int(out.num_draft_tokens > 0),
            )
            if out.num_verify_tokens:  # a decode round (a step holds one at most, after its prefill's first token)
                m.observe_decode_round(out.num_accepted_tokens, request.service_class)
            if out.num_draft_tokens > 0:
                m.observe_spec_round(out.num_draft_tokens, out.num_accepted_tokens, request.service_class)
                self.load.observe_round(request.service_class, out.num_accepted_tokens)
            if out.finished:
                del self._running[out.request_id]
                request.done = True
                self._observe_finished(request, out.finish_reason or "stop")
            items.append((request, (out, stats, request.index)))
        self._deliver(items)

    def _observe_finished(self, request: _Request, status: str) -> None:
        """One sequence's request metrics; the prompt counts once, with the first sequence (computed once)."""
        num_prompt = request.stats.num_prompt_tokens if request.first_token is not None and not request.index else 0
        self.metrics.observe_request(
            (self.metrics.model,),
            status=status,
            arrival=request.arrival,
            first_token=request.first_token,
            finished=time.perf_counter(),
            num_prompt_tokens=num_prompt,
            num_output_tokens=request.stats.num_output_tokens,
        )

    def _update_gauges(self) -> None:
        num_waiting = sum(len(group) for group in self._waiting)
        self.metrics.num_requests_running.labels(self.metrics.model).set(self.engine.num_running)
        self.metrics.num_requests_waiting.labels(self.metrics.model).set(num_waiting)
        num_kv_used = sum(len(r.prompt_token_ids) + r.stats.num_output_tokens for r in self._running.values())
        self.load.observe_occupancy(self.engine.num_running, num_waiting, num_kv_used)
        waiting, running, kv_usage = self.metrics.inference_extension.values()
        waiting.set(num_waiting)
        running.set(self.engine.num_running)
        kv_usage.set(self.load.kv_utilization)

    @staticmethod
    def _deliver(items: list[tuple[_Request, object]]) -> None:
        """Hand outputs to their callers' loops: one thread hop per loop per step, not per request."""
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for request, item in items:
            by_loop.setdefault(request.loop, []).append((request.outputs, item))
        for loop, batch in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, batch)
            except RuntimeError:  # that loop is closed: its callers are gone
                pass


def _put_all(batch) -> None:
    for outputs, item in batch:
        outputs.put_nowait(item)
