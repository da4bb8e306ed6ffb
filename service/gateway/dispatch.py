"""One request's trip through the gateway, shared by the HTTP and gRPC APIs: pick a worker, stream, account.

`Dispatcher.generate` yields `Chunk`s from a worker, those of a request's n sequences (choices) interleaved, each
with its `index`; a model that makes one sequence per request is asked for n as n requests (`fanout.py`). Before
the first chunk of any sequence it may move the request to another worker (the worker was saturated, unreachable
or failed); after it, a failure is the caller's error (HTTP turns it into an error event inside the SSE stream).
Cancelling the consuming task (client disconnect, gRPC cancel, `Abort`, the end of the drain timeout) closes the
worker call, which aborts the sequences and frees their batch slots; `Abort` and `cut` also say why, as the error
the request then ends with. Requests belong to their caller (the API key that sent them): request ids are per
caller, and `Abort` reaches only the caller's own. Metrics and the request log line are written here, once per
request whatever its n: the prompt counted once, the other counts summed over the sequences (`total_stats`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from deepspec_protocol.worker import RequestStats
from service.gateway import errors
from service.gateway.admission import AdmissionQueue, estimate_tokens
from service.gateway.fanout import fan_out
from service.gateway.routing import Endpoint, WorkerPool
from service.gateway.scoring import prefix_key
from service.gateway.service_classes import ServiceClasses, memory_session
from service.gateway.validation import check_prompt_size
from service.gateway.worker_client import Chunk, GenerationRequest, WorkerError, merge_sequences, total_stats
from service.logging import log_request

#: worker statuses that mean "this worker cannot take it now; another may" (retried before the first token)
_RETRYABLE = {"RESOURCE_EXHAUSTED", "UNAVAILABLE", "INTERNAL", "UNKNOWN", "CANCELLED", "NOT_FOUND"}


def new_request_id(prefix: str) -> str:
    """`prefix`-<24 random hex digits>: 96 random bits from the OS, without building a UUID for them."""
    return f"{prefix}-{os.urandom(12).hex()}"


@dataclass
class _Progress:
    """How far one request's trip has got: the attempts write it, the accounting in `generate`'s finally reads it."""

    arrival: float
    first: float | None = None
    last: float | None = None
    worker: str | None = None
    #: sequence index -> its counts so far
    latest: dict[int, RequestStats] = field(default_factory=dict)
    #: set once a worker served the request to its end
    finish_reason: str | None = None
    #: every worker the last round of attempts tried refused it as saturated
    saturated: bool = False


def _prompt_chars(req: GenerationRequest) -> int:
    return len(req.prompt or "") + sum(len(m["content"]) for m in req.messages or ()) + len(req.prompt_token_ids or ())


class Dispatcher:
    def __init__(
        self,
        pool: WorkerPool,
        metrics,
        *,
        request_timeout_s: float = 600.0,
        max_attempts: int = 3,
        retry_after_s: int = 1,
        classes: ServiceClasses | None = None,
        admission: AdmissionQueue | None = None,
    ):
        self.pool = pool
        #: each caller's service class, weight, budget and latency objective
        self.classes = classes or ServiceClasses()
        #: who goes to a worker next when they cannot all go now
        self.admission = admission or AdmissionQueue(lambda: None, retry_after_s=retry_after_s)
        self.metrics = metrics
        self.request_timeout_s = request_timeout_s
        self.max_attempts = max_attempts
        self.retry_after_s = retry_after_s
        self.draining = False
        #: (caller, request id) -> the task consuming it (for deepspec.v1.Completions/Abort)
        self.inflight: dict[tuple[str | None, str], asyncio.Task] = {}
        #: requests cancelled on purpose -> the error each ends with instead of a bare cancellation
        self._interrupted: dict[tuple[str | None, str], errors.ServiceError] = {}

    @property
    def ready(self) -> bool:
        return not self.draining and self.pool.has_healthy

    def resolve_model(self, requested: str | None) -> tuple[str, int]:
        """The served model a request names (or the only one when it names none) and its context length."""
        models = self.pool.models()
        if not models:
            raise errors.ServiceUnavailableError(
                "no worker is ready yet; retry shortly", retry_after_s=self.retry_after_s
            )
        if not requested:
            if len(models) == 1:
                return next(iter(models.items()))
            raise errors.BadRequestError(f"several models are served, name one of {sorted(models)}", param="model")
        if requested not in models:
            raise errors.NotFoundError(
                f"the model {requested!r} does not exist; served models: {sorted(models)}",
                param="model",
                code="model_not_found",
            )
        return requested, models[requested]

    async def generate(
        self, req: GenerationRequest, api: str, unary: bool = False, caller: str | None = None
    ) -> AsyncGenerator[Chunk, None]:
        """Stream `req` from a worker for `caller` (None = auth off); `unary=True` (non-streaming APIs) uses one
        ModelInfer call instead. The request first takes a slot in the admission queue (its caller's service class
        decides its rank there and is sent to the worker); when every worker is saturated it waits there again."""
        key = self._admit(req, caller)
        policy = self.classes.policy(caller)
        req.service_class = policy.service_class
        req.memory_session = memory_session(caller, req.session, policy)
        ticket = self.admission.ticket(caller, policy, estimate_tokens(_prompt_chars(req), req.max_tokens, req.n))
        run = _Progress(arrival=time.perf_counter())
        status, error_text = "abort", None
        try:
            if not self.admission.try_admit(ticket):  # the usual case costs no await
                await self.admission.wait(ticket)
            while True:
                async with contextlib.aclosing(self._attempts(req, unary, run, key)) as chunks:
                    async for chunk in chunks:
                        yield chunk
                if run.finish_reason is not None:
                    status = run.finish_reason
                    return
                if not run.saturated:
                    raise errors.ServiceUnavailableError(
                        f"no ready worker serves {req.model!r}", code="no_worker", retry_after_s=self.retry_after_s
                    )
                if not self.admission.max_waiting:  # no queue: answer at once
                    raise errors.RateLimitError(
                        "every worker is saturated; retry after the Retry-After delay",
                        code="server_busy",
                        retry_after_s=self.retry_after_s,
                    )
                await self.admission.readmit(ticket)  # Shed when no slot frees within its latency objective
        except errors.ServiceError as e:
            status, error_text = e.status, e.message
            raise
        except (asyncio.CancelledError, GeneratorExit):
            status = "abort"
            interrupted = self._interrupted.pop(key, None)
            if interrupted is not None:  # Abort or cut: end the call with that error, not a bare cancellation
                _running_task().uncancel()
                error_text = interrupted.message
                raise interrupted from None
            raise
        except Exception as e:
            status, error_text = "internal_error", f"{type(e).__name__}: {e}"
            raise
        finally:
            self.inflight.pop(key, None)
            self._interrupted.pop(key, None)
            stats = total_stats(run.latest.values())
            self.admission.release(ticket, stats.num_prompt_tokens + stats.num_output_tokens if run.latest else None)
            self._record(req, api, run.worker, status, error_text, stats, run.arrival, run.first)

    async def _attempts(
        self, req: GenerationRequest, unary: bool, run: _Progress, key: tuple[str | None, str]
    ) -> AsyncGenerator[Chunk, None]:
        """`req`'s chunks from the first of up to `max_attempts` workers that serves it; before its first token a
        request moves on from a worker that is saturated, unreachable or failing. Ends with `run.finish_reason` set
        (served), or without it: then `run.saturated` says whether every worker tried was only full."""
        tried: set[str] = set()
        run.saturated = False
        chunk = Chunk("")
        prefix = None if req.session or not self.pool.scores else prefix_key(req.prompt, req.messages)
        for _ in range(self.max_attempts):
            endpoint = self.pool.pick(req.model, tried, req.session, prefix, req.service_class)
            if endpoint is None:
                return
            run.worker = endpoint.address
            tried.add(run.worker)
            _check_extensions(req, endpoint)
            series = self.metrics.series((req.model, run.worker))
            try:
                with self.pool.track(endpoint):
                    async for chunk in await self._call(endpoint, req, unary):
                        run.latest[chunk.index] = chunk.stats
                        if chunk.load is not None:
                            self.pool.observe_load(endpoint, chunk.load)
                        now = time.perf_counter()
                        if unary:  # the worker's histograms have TTFT and inter-token latency for these
                            run.first = now
                        elif run.first is None:
                            run.first = now
                            series.time_to_first_token.observe(now - run.arrival)
                        else:
                            assert run.last is not None  # set with run.first, a chunk before
                            series.inter_token_latency.observe(now - run.last)
                        run.last = now
                        yield chunk
                        self.inflight[key] = _running_task()  # the consumer may change tasks
                run.finish_reason = chunk.finish_reason or "stop"
                self.pool.served(endpoint, req.session, prefix)
                return
            except WorkerError as e:
                if (
                    run.first is not None
                    or e.status in ("INVALID_ARGUMENT", "DEADLINE_EXCEEDED")
                    or (e.status not in _RETRYABLE)
                ):
                    raise _to_service_error(e, started=run.first is not None) from None
                run.saturated |= e.status == "RESOURCE_EXHAUSTED"
                if e.status in ("UNAVAILABLE", "INTERNAL", "UNKNOWN"):
                    self.pool.eject(endpoint, e.message)
                self.metrics.retries.labels(run.worker).inc()

    async def _call(self, endpoint: Endpoint, req: GenerationRequest, unary: bool) -> AsyncGenerator[Chunk, None]:
        """`req`'s chunks from `endpoint`, streamed or (`unary`) whole: one call, or one per sequence where the
        model takes one sequence per request (the prompt is then prefilled n times)."""
        call = endpoint.client.infer if unary else endpoint.client.generate
        if req.n > 1 and not await endpoint.client.takes_n(req.model, self.request_timeout_s):
            return fan_out(call, req, self.request_timeout_s)
        return call(req, self.request_timeout_s)

    def _admit(self, req: GenerationRequest, caller: str | None) -> tuple[str | None, str]:
        """Refuse what no worker should see (a draining gateway, a prompt past every context, a request id already
        running for this caller); → the request's key in `inflight`, where its task is now registered."""
        if self.draining:
            raise errors.ServiceUnavailableError("the gateway is shutting down", retry_after_s=self.retry_after_s)
        check_prompt_size(_prompt_chars(req) - len(req.prompt_token_ids or ()), self.pool.models().get(req.model, 0))
        key = (caller, req.request_id)
        if key in self.inflight:
            raise errors.BadRequestError(f"request id {req.request_id!r} is already running", param="request_id")
        self.inflight[key] = _running_task()
        return key

    def _record(
        self,
        req: GenerationRequest,
        api: str,
        worker: str | None,
        status: str,
        error_text: str | None,
        stats,
        arrival: float,
        first: float | None,
    ) -> None:
        """A finished request's metrics (latency, tokens, spec-decode counts) and its request-log line."""
        finished = time.perf_counter()
        labels = (req.model, worker or "none")
        self.metrics.observe_request(
            labels,
            status=status,
            arrival=arrival,
            first_token=first,
            finished=finished,
            num_prompt_tokens=stats.num_prompt_tokens,
            num_output_tokens=stats.num_output_tokens,
        )
        if stats.num_draft_tokens:
            series = self.metrics.series((*labels, req.service_class))
            series.spec_decode_num_draft_tokens.inc(stats.num_draft_tokens)
            series.spec_decode_num_accepted_tokens.inc(stats.num_accepted_tokens)
            series.spec_decode_num_drafts.inc(stats.num_spec_steps)
        log_request(
            request_id=req.request_id,
            api=api,
            model=req.model,
            worker=worker,
            status=status,
            stats=stats,
            ttft_s=None if first is None else first - arrival,
            duration_s=finished - arrival,
            error=error_text,
        )

    async def complete(self, req: GenerationRequest, api: str, caller: str | None = None) -> list[Chunk]:
        """Run a request to the end: one chunk per sequence, in index order, with its whole text, scores and
        counts (`total_stats` of their stats is the usage)."""
        chunks = merge_sequences([chunk async for chunk in self.generate(req, api, unary=True, caller=caller)])
        if [c.index for c in chunks] != list(range(req.n)):
            raise errors.ServiceError(
                f"the worker answered the sequences {[c.index for c in chunks]} of a request for {req.n}",
                code="worker_error",
            )
        return chunks

    async def complete_all(
        self, reqs: list[GenerationRequest], api: str, caller: str | None = None
    ) -> list[list[Chunk]]:
        """Run several requests (a batch of prompts) side by side to the end, each request's sequences as
        `complete` gives them; the first failure fails them all and cancels the rest."""
        if len(reqs) == 1:  # one prompt, the usual request: no task of its own
            return [await self.complete(reqs[0], api, caller)]
        tasks = [asyncio.ensure_future(self.complete(req, api, caller)) for req in reqs]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for task in tasks:
                task.cancel()

    def abort(self, request_id: str, caller: str | None = None) -> bool:
        """Cancel `caller`'s request `request_id`; False when the caller has no such request running."""
        error = errors.RequestAbortedError(f"request {request_id} was aborted", code="aborted")
        return self._interrupt((caller, request_id), error)

    def cut(self, reason: str) -> int:
        """End every request still running with the error a failed worker gives (HTTP streams: an error event, then
        `[DONE]`); returns how many."""
        return sum(
            self._interrupt(
                key, errors.ServiceUnavailableError(f"the request was cut short: {reason}", code="worker_failed")
            )
            for key in list(self.inflight)
        )

    def _interrupt(self, key: tuple[str | None, str], error: errors.ServiceError) -> bool:
        task = self.inflight.get(key)
        if task is None:
            return False
        self._interrupted[key] = error
        task.cancel()
        return True

    async def drain(self, timeout_s: float) -> None:
        """Refuse new requests, then wait up to `timeout_s` for in-flight ones."""
        self.draining = True
        deadline = time.monotonic() + timeout_s
        while self.inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)


def _check_extensions(req: GenerationRequest, endpoint: Endpoint) -> None:
    """Refuse what `endpoint`'s client would drop (an OpenAI-HTTP worker's: a logprobs mode) rather than send it."""
    unsupported = req.extensions - getattr(endpoint.client, "extensions", frozenset())
    if unsupported:
        raise errors.BadRequestError(
            f"{' and '.join(sorted(unsupported))} are not supported by this worker ({endpoint.address})"
        )


def _to_service_error(e: WorkerError, started: bool) -> errors.ServiceError:
    if e.status == "INVALID_ARGUMENT":  # the worker's engine refused the content: its code is the error body's
        return errors.BadRequestError(e.message, code=e.code)
    if e.status == "DEADLINE_EXCEEDED":
        return errors.TimeoutError_("the request ran past the gateway's request timeout", code="timeout")
    if started:
        return errors.ServiceUnavailableError(f"the worker failed mid-generation: {e.message}", code="worker_failed")
    return errors.ServiceError(f"worker error: {e.message}", code="worker_error")


def _running_task() -> asyncio.Task:
    """The task running the caller: a request's generator is always driven by one (its HTTP or gRPC handler's)."""
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("the dispatcher runs inside an asyncio task")
    return task
