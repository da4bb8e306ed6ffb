"""When to send each request: closed loop, Poisson or gamma arrivals.

The two families answer different questions. A closed loop (`--max-concurrency N`, no rate) keeps exactly N
requests in flight and measures the best throughput the server gives at that concurrency; it can never
overload the server, so it hides queueing. An open loop (`--request-rate R`) sends requests at times drawn
independently of how fast the server answers, as real users do, so latency grows when the server falls behind.

Open-loop gaps are gamma distributed with shape = burstiness and mean 1/rate (as in `vllm bench serve`):
burstiness 1 is a Poisson process (exponential gaps); below 1 the arrivals come in bursts, above 1 they are
more regular. Rate `inf` sends everything at once.
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass


class ArrivalKind(str, enum.Enum):
    """The values are what the report writes in `arrival`."""

    CLOSED_LOOP = "closed-loop"
    POISSON = "poisson"
    GAMMA = "gamma"
    BURST = "burst"  # rate = inf: everything at t = 0


@dataclass(frozen=True, slots=True)
class LoadPoint:
    """One point of load: the offered rate and/or the concurrency limit.

    rate=inf with max_concurrency=N is a closed loop of N; a finite rate with max_concurrency=N is an open loop
    whose in-flight requests are capped at N. Arrivals over the cap wait in the client, and, as in `vllm bench
    serve`, that wait is not part of their latency: each request's clock starts when it is sent.
    """

    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        if not self.request_rate > 0:
            raise ValueError(f"request rate must be > 0 requests/s (or inf), got {self.request_rate}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be > 0 (1 = Poisson), got {self.burstiness}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max concurrency must be >= 1, got {self.max_concurrency}")

    @property
    def kind(self) -> ArrivalKind:
        if math.isinf(self.request_rate):
            return ArrivalKind.CLOSED_LOOP if self.max_concurrency else ArrivalKind.BURST
        return ArrivalKind.POISSON if self.burstiness == 1.0 else ArrivalKind.GAMMA

    def describe(self) -> str:
        rate = "inf" if math.isinf(self.request_rate) else f"{self.request_rate:g} req/s"
        conc = f", max concurrency {self.max_concurrency}" if self.max_concurrency else ""
        burst = f", burstiness {self.burstiness:g}" if self.kind is ArrivalKind.GAMMA else ""
        return f"{self.kind.value}: rate {rate}{burst}{conc}"


def gamma_intervals(rate: float, burstiness: float, rng: random.Random) -> Iterator[float]:
    """Endless inter-arrival gaps in seconds, gamma(shape=burstiness, scale=1/(rate*burstiness)): mean 1/rate,
    coefficient of variation 1/sqrt(burstiness)."""
    if math.isinf(rate):
        while True:
            yield 0.0
    scale = 1.0 / (rate * burstiness)
    if burstiness == 1.0:
        while True:
            yield rng.expovariate(rate)
    while True:
        yield rng.gammavariate(burstiness, scale)


def arrival_offsets(rate: float, burstiness: float, rng: random.Random) -> Iterator[float]:
    """Send times relative to the start of the run, seconds. The first request goes at t = 0."""
    t = 0.0
    gaps = gamma_intervals(rate, burstiness, rng)
    while True:
        yield t
        t += next(gaps)
