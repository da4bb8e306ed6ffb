"""The gateway's admission queue: which request goes to a worker next when they cannot all go now.

A request is admitted at once while the pool has room: fewer requests in flight than `limit()` (the per-worker cap
times the admitted workers; None = no cap of the gateway's own), plus `reserve()` more for the most urgent class
(slots batch traffic can never fill, so an interactive request finds one free), and nobody waiting ahead of it.
Otherwise it waits here, in a bounded queue, instead of being answered 429, and so does a request every worker
refused as saturated (`readmit`): a finished request frees its slot to the best waiter. "Best" is:

1. the most urgent service class (interactive, then standard, then batch: service_classes.py);
2. within a class, the caller that has been served the fewest weighted tokens: the Virtual Token Counter of Sheng et
   al., "Fairness in Serving Large Language Models" (OSDI '24, arXiv 2401.00588, Algorithm 2). Each caller's counter
   grows by the tokens it is served over its weight; a caller that starts waiting is lifted to the smallest counter
   among the callers of its class already active, so idling banks no credit. Tokens are charged when a request is
   admitted (an estimate: prompt characters / 4 + max_tokens per choice) and corrected by its usage when it ends;
3. first come, first served.

Shedding, always with a reason (the `x-deepspec-drop-reason` header, and the error code, so the `status` label of
`deepspec:request_success_total`):
`queue_full` (the queue is full and the request ranks last), `displaced` (a waiting request gave its place to a more
urgent one), `queue_timeout` (it waited past its key's `ttft_objective_s`, or the gateway's --queue-timeout-s) and
`token_budget` (its key spent its tokens per minute; Retry-After says when enough are back). The lowest class goes
first by construction: it ranks last in every comparison.

No clock is read but `clock` (tests pass their own); the queue runs on the gateway's event loop, unlocked.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from service.gateway import errors
from service.gateway.service_classes import KeyPolicy

#: why a request was shed (the drop-reason header's values and the metric's `reason` label)
DROP_REASONS = ("queue_full", "displaced", "queue_timeout", "token_budget")
#: characters per token for the admission estimate (the gateway has no tokenizer; usage corrects it)
CHARS_PER_TOKEN = 4
#: completion tokens assumed for a request that sets no max_tokens (usage corrects it)
DEFAULT_COMPLETION_TOKENS = 256


def estimate_tokens(num_prompt_chars: int, max_tokens: int | None, n: int) -> int:
    """The tokens a request is charged when admitted, before its usage is known."""
    completion = DEFAULT_COMPLETION_TOKENS if max_tokens is None else max_tokens
    return max(1, num_prompt_chars // CHARS_PER_TOKEN + completion * n)


@dataclass(eq=False)
class Ticket:
    """One request's place in the admission queue."""

    caller: str | None
    policy: KeyPolicy
    #: tokens charged at admission (corrected at release)
    num_tokens: int
    arrival: float
    seq: int
    #: resolved when the request is granted a slot (or failed with the error that sheds it)
    grant: asyncio.Future | None = None
    admitted: bool = False


@dataclass
class TokenBucket:
    """A key's tokens-per-minute budget: holds one minute's worth, refills continuously; may go into debt when a
    request's usage exceeds what it was charged."""

    tokens_per_minute: int
    tokens: float = field(init=False)
    updated: float = 0.0

    def __post_init__(self):
        self.tokens = float(self.tokens_per_minute)

    def refill(self, now: float) -> None:
        self.tokens = min(self.tokens_per_minute, self.tokens + (now - self.updated) * self.tokens_per_minute / 60)
        self.updated = now

    def seconds_until(self, num_tokens: int) -> float:
        """How long until `num_tokens` (at most a full bucket) are available; 0 when they are."""
        wanted = min(num_tokens, self.tokens_per_minute)
        return max(0.0, (wanted - self.tokens) * 60 / self.tokens_per_minute)


class Shed(errors.ServiceError, http=429, kind="rate_limit_error", grpc_status=grpc.StatusCode.RESOURCE_EXHAUSTED):
    """A request the gateway's admission queue refused or dropped, with why (`drop_reason`) and Retry-After."""

    def __init__(self, message: str, reason: str, retry_after_s: int):
        assert reason in DROP_REASONS, reason
        super().__init__(message, code=reason, retry_after_s=retry_after_s)
        self.drop_reason = reason


class AdmissionQueue:
    def __init__(
        self,
        limit: Callable[[], int | None],
        *,
        reserve: Callable[[], int] = lambda: 0,
        max_waiting: int = 256,
        queue_timeout_s: float = 30.0,
        retry_after_s: int = 1,
        poll_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.limit = limit
        self.reserve = reserve
        self.max_waiting = max_waiting
        self.queue_timeout_s = queue_timeout_s
        self.retry_after_s = retry_after_s
        #: how often the head of the queue retries when nothing in flight here will free a slot (no cap of the
        #: gateway's own, and the workers are full of other gateways' requests)
        self.poll_s = poll_s
        self.clock = clock
        self.in_flight = 0
        self.waiting: list[Ticket] = []
        #: caller -> virtual token counter: weighted tokens served (VTC)
        self.counters: dict[str | None, float] = {}
        #: caller -> its requests waiting or admitted, and the class they run under
        self.active: dict[str | None, int] = {}
        self.class_of: dict[str | None, str] = {}
        self.buckets: dict[str | None, TokenBucket] = {}
        self._seq = itertools.count()

    # -- the caller's side --------------------------------------------------------------------------------------

    def ticket(self, caller: str | None, policy: KeyPolicy, num_tokens: int) -> Ticket:
        return Ticket(caller, policy, num_tokens, self.clock(), next(self._seq))

    def try_admit(self, ticket: Ticket) -> bool:
        """Give `ticket` a slot now if it may have one (room, and nobody waiting ranks before it); False when it
        must `admit` (wait). `Shed` when its key's budget is spent. Synchronous: the usual case costs no await."""
        self._charge_budget(ticket)
        self._activate(ticket)
        if self._has_room(ticket) and (not self.waiting or self._order(ticket) < self._order(self._best())):
            self._take_slot(ticket)
            return True
        return False

    async def admit(self, ticket: Ticket) -> None:
        """Return once `ticket` holds a slot; `Shed` when it is refused or dropped (nothing is then held)."""
        if not self.try_admit(ticket):
            await self.wait(ticket)

    async def wait(self, ticket: Ticket) -> None:
        """Wait in line for a slot, after `try_admit` said there is none now."""
        await self._wait(ticket)

    async def readmit(self, ticket: Ticket) -> None:
        """Every worker refused `ticket`'s request as saturated: give its slot up and wait for one to be freed
        (it keeps its place in line: its arrival and counter are unchanged)."""
        ticket.admitted = False
        self.in_flight -= 1
        self._grant_waiting()
        await self._wait(ticket, retrying=True)

    def release(self, ticket: Ticket, num_tokens_used: int | None) -> None:
        """`ticket`'s request ended; `num_tokens_used` its usage (None = unknown: the estimate stands)."""
        if ticket.admitted:
            ticket.admitted = False
            self.in_flight -= 1
            self._deactivate(ticket)
        if num_tokens_used is not None:
            correction = num_tokens_used - ticket.num_tokens
            self.counters[ticket.caller] = self.counters.get(ticket.caller, 0.0) + correction / ticket.policy.weight
            bucket = self.buckets.get(ticket.caller)
            if bucket is not None:
                bucket.tokens -= correction
        self._grant_waiting()

    # -- queue --------------------------------------------------------------------------------------------------

    async def _wait(self, ticket: Ticket, retrying: bool = False) -> None:
        objective = ticket.policy.ttft_objective_s or self.queue_timeout_s
        deadline = ticket.arrival + objective
        try:
            if len(self.waiting) >= self.max_waiting:
                self._make_room_for(ticket)
            ticket.grant = asyncio.get_running_loop().create_future()
            self.waiting.append(ticket)
            while True:
                remaining = deadline - self.clock()
                if remaining <= 0:
                    raise Shed(
                        f"the request waited {objective:g} s for a worker, its latency objective: the service "
                        "is overloaded; retry after the Retry-After delay",
                        "queue_timeout",
                        self.retry_after_s,
                    )
                done, _ = await asyncio.wait({ticket.grant}, timeout=min(remaining, self.poll_s))
                if done:
                    ticket.grant.result()  # Shed when it was displaced
                    return
                if (retrying or self.limit() is None) and not self.in_flight and self._best() is ticket:
                    self._grant(ticket)  # nothing in flight here will free a slot: the head tries again
        except BaseException:
            if ticket in self.waiting:
                self.waiting.remove(ticket)
            if ticket.admitted:  # cancelled right after its grant: the slot goes back
                self.release(ticket, None)
            else:
                self._deactivate(ticket)
            raise

    def _make_room_for(self, ticket: Ticket) -> None:
        """The queue is full: shed its last-ranked request, `ticket` itself when nothing ranks below it."""
        worst = max(self.waiting, key=self._order)
        if self._order(ticket) >= self._order(worst):
            raise Shed(
                f"the gateway's queue is full ({self.max_waiting} requests wait, none of a lower class "
                "than this one): retry after the Retry-After delay",
                "queue_full",
                self.retry_after_s,
            )
        self.waiting.remove(worst)
        assert worst.grant is not None  # a waiting ticket's future is made before it joins the queue
        worst.grant.set_exception(
            Shed(
                f"a more urgent request took this one's place in the gateway's queue "
                f"(class {worst.policy.service_class})",
                "displaced",
                self.retry_after_s,
            )
        )

    def _grant_waiting(self) -> None:
        while self.waiting and self._has_room(best := self._best()):
            self._grant(best)

    def _grant(self, ticket: Ticket) -> None:
        self.waiting.remove(ticket)
        self._take_slot(ticket)
        assert ticket.grant is not None  # a waiting ticket's future is made before it joins the queue
        ticket.grant.set_result(None)

    def _best(self) -> Ticket:
        return min(self.waiting, key=self._order)

    def _order(self, ticket: Ticket) -> tuple:
        """Smaller is served sooner, larger shed sooner: class, then weighted tokens served, then arrival."""
        return ticket.policy.rank, self.counters.get(ticket.caller, 0.0), ticket.seq

    def _has_room(self, ticket: Ticket) -> bool:
        limit = self.limit()
        if limit is None:
            return True
        return self.in_flight < limit + (self.reserve() if ticket.policy.rank == 0 else 0)

    def _take_slot(self, ticket: Ticket) -> None:
        ticket.admitted = True
        self.in_flight += 1
        self.counters[ticket.caller] = self.counters.get(ticket.caller, 0.0) + ticket.num_tokens / ticket.policy.weight

    # -- fairness and budgets -----------------------------------------------------------------------------------

    def _activate(self, ticket: Ticket) -> None:
        """Count `ticket` as its caller's; a caller with nothing active starts at the smallest counter among the
        active callers of its class (VTC's lift): it is served next, but banks nothing for the time it was idle."""
        caller, service_class = ticket.caller, ticket.policy.service_class
        if not self.active.get(caller):
            peers = [
                self.counters.get(c, 0.0) for c, n in self.active.items() if n and self.class_of.get(c) == service_class
            ]
            self.counters[caller] = max(self.counters.get(caller, 0.0), min(peers, default=0.0))
            self.class_of[caller] = service_class
        self.active[caller] = self.active.get(caller, 0) + 1

    def _deactivate(self, ticket: Ticket) -> None:
        self.active[ticket.caller] = max(0, self.active.get(ticket.caller, 0) - 1)

    def _charge_budget(self, ticket: Ticket) -> None:
        """Take `ticket`'s estimate from its key's tokens-per-minute budget; Shed when the budget cannot cover it."""
        tpm = ticket.policy.tokens_per_minute
        if not tpm:
            return
        bucket = self.buckets.get(ticket.caller)
        if bucket is None or bucket.tokens_per_minute != tpm:
            bucket = self.buckets[ticket.caller] = TokenBucket(tpm, updated=ticket.arrival)
        bucket.refill(self.clock())
        wait_s = bucket.seconds_until(ticket.num_tokens)
        if wait_s > 0:
            raise Shed(
                f"this API key's budget of {tpm} tokens per minute is spent (the request needs about "
                f"{ticket.num_tokens}): retry after the Retry-After delay",
                "token_budget",
                max(1, math.ceil(wait_s)),
            )
        bucket.tokens -= ticket.num_tokens
