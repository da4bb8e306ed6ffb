"""Which worker serves a request: discovery, active health checks with ejection, and least-outstanding P2C.

- Discovery (`discovery_for`): a static `host:port` list, `dns://name:port` (a Kubernetes headless Service)
  re-resolved every `dns_refresh_s`, or `k8s://service[.namespace]:port` whose EndpointSlices are watched through the
  Kubernetes API (`discovery_k8s.py`). Both dynamic sources feed `set_addresses`: addresses that appear are probed
  before they get traffic, addresses that vanish are dropped and their channel closed once their last request ends.
- Kind: each address names its protocol (`upstreams.py`: KServe v2 gRPC or OpenAI HTTP); the pool treats both alike.
- Health: every `health_interval_s` each worker gets a readiness probe (`ServerReady`, or an OpenAI engine's
  `/health`). `unhealthy_threshold` failures in a row
  (or one refused connection, or a request that fails with UNAVAILABLE) eject it; one good probe re-admits it.
- Choice (`pick`): a session's turns stay on the worker that served its last one while it is admitted; otherwise
  the admitted worker serving the model where the request would get the most tokens per second, from the load
  the workers report with their responses (scoring.py, with approximate prefix affinity). Where a candidate's
  report is stale, or `routing` is "p2c": power of two choices, the one with fewer outstanding requests
  (Mitzenmacher; production-stack's least-loaded router without a global scan).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import time
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Literal

import grpc

from deepspec_protocol.worker import DEFAULT_SERVICE_CLASS, WorkerLoad
from service.gateway.scoring import PREFIX_AFFINITY_SLACK, AffinityTable, LoadScore
from service.gateway.upstreams import client_for
from service.gateway.worker_client import WorkerClient, WorkerError

Routing = Literal["goodput", "p2c"]

logger = logging.getLogger(__name__)

_PROBE_TIMEOUT_S = 1.0

Discovery = Literal["static", "dns", "endpointslices"]


def discovery_for(workers: str) -> Discovery:
    """The discovery a `--workers` value implies: `dns://` -> dns, `k8s://` -> endpointslices, else static."""
    return "dns" if workers.startswith("dns://") else "endpointslices" if workers.startswith("k8s://") else "static"


@dataclass(eq=False)
class Endpoint:
    address: str
    #: a KServe v2 `WorkerClient` or an `OpenAIClient` (service/gateway/upstreams.py): the same verbs
    client: WorkerClient
    outstanding: int = 0
    healthy: bool = False
    consecutive_failures: int = 0
    #: model name -> context length (0 = unknown)
    models: dict[str, int] = field(default_factory=dict)
    #: the load the worker last reported (with a response), ready to score; when (time.monotonic) and how many
    #: requests this gateway had outstanding there then
    load: LoadScore | None = None
    load_observed_at: float = 0.0
    outstanding_at_load: int = 0


class WorkerPool:
    def __init__(
        self,
        workers: str,
        metrics,
        health_interval_s: float = 2.0,
        unhealthy_threshold: int = 2,
        dns_refresh_s: float = 5.0,
        rng: random.Random | None = None,
        k8s_api_url: str = "",
        make_client=client_for,
        routing: Routing = "goodput",
        load_max_age_s: float = 5.0,
        clock=time.monotonic,
    ):
        self.spec = workers
        self.discovery = discovery_for(workers)
        #: Kubernetes API base URL for endpointslices discovery ("" = the pod's in-cluster config)
        self.k8s_api_url = k8s_api_url
        self.metrics = metrics
        self.health_interval_s = health_interval_s
        self.unhealthy_threshold = unhealthy_threshold
        self.dns_refresh_s = dns_refresh_s
        self.endpoints: dict[str, Endpoint] = {}
        self._rng = rng or random.Random()
        self._tasks: list[asyncio.Task] = []
        self._changed = asyncio.Event()
        #: worker address -> its client (the address's scheme, or the default protocol, picks the kind)
        self._make_client = make_client
        #: "goodput": score by expected tokens/s with session and prefix affinity; "p2c": power of two choices only
        self.routing = routing
        #: a load report older than this is stale: the pick falls back to power of two choices
        self.load_max_age_s = load_max_age_s
        self.clock = clock
        self.sessions = AffinityTable()
        self.prefixes = AffinityTable()

    # -- lifecycle ----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self.discovery == "dns":
            await self._resolve_dns()
            self._tasks.append(asyncio.create_task(self._dns_loop()))
        elif self.discovery == "endpointslices":
            from service.gateway.discovery_k8s import EndpointSliceWatcher, KubeAPI, ServiceRef

            ref = ServiceRef.parse(self.spec)
            api = KubeAPI.in_cluster(url=self.k8s_api_url, namespace=ref.namespace or "")
            watcher = EndpointSliceWatcher(api, ref, on_change=self._on_endpointslices)
            self._tasks.append(asyncio.create_task(watcher.run()))  # the pool fills as the first list answers
        else:
            for address in filter(None, (a.strip() for a in self.spec.split(","))):
                self._add(address)
        await self.probe_all()
        self._tasks.append(asyncio.create_task(self._health_loop()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(e.client.close() for e in self.endpoints.values()), return_exceptions=True)

    # -- routing ------------------------------------------------------------------------------------------------

    @property
    def has_healthy(self) -> bool:
        return any(e.healthy for e in self.endpoints.values())

    def models(self) -> dict[str, int]:
        """Every model an admitted worker serves -> its smallest known context length."""
        merged: dict[str, int] = {}
        for endpoint in self.endpoints.values():
            if endpoint.healthy:
                for name, n in endpoint.models.items():
                    known = merged.get(name)
                    merged[name] = n if known is None else min(known, n) if known and n else known or n
        return merged

    def pick(
        self,
        model: str,
        exclude: AbstractSet[str] = frozenset(),
        session: str | None = None,
        prefix: str | None = None,
        service_class: str = DEFAULT_SERVICE_CLASS,
    ) -> Endpoint | None:
        """The worker for a request (module docstring); None when no admitted worker serves `model`."""
        candidates = [
            e for e in self.endpoints.values() if e.healthy and model in e.models and e.address not in exclude
        ]
        if len(candidates) <= 1:
            return candidates[0] if candidates else None
        if self.routing == "p2c":
            return self._two_choices(candidates)
        held = self.sessions.get(session)
        if held is not None:
            endpoint = self.endpoints.get(held)
            if endpoint is not None and endpoint in candidates:
                return endpoint
        now = self.clock()
        scores = {}
        for e in candidates:
            if e.load is None or now - e.load_observed_at > self.load_max_age_s:
                return self._two_choices(candidates)  # fail open: some signals are stale
            scores[e.address] = e.load.tokens_per_s(service_class, e.outstanding - e.outstanding_at_load)
        best = max(candidates, key=lambda e: (scores[e.address], -e.outstanding, self._rng.random()))
        preferred = self.endpoints.get(self.prefixes.get(prefix) or "")
        if preferred in candidates and scores[preferred.address] >= PREFIX_AFFINITY_SLACK * scores[best.address]:
            return preferred
        return best

    @property
    def scores(self) -> bool:
        """Whether picks are scored (and prefixes matter): goodput routing over more than one worker."""
        return self.routing == "goodput" and len(self.endpoints) > 1

    def _two_choices(self, candidates: list[Endpoint]) -> Endpoint:
        a, b = self._rng.sample(candidates, 2)
        return a if a.outstanding <= b.outstanding else b

    def observe_load(self, endpoint: Endpoint, load: WorkerLoad) -> None:
        """A load report that came with one of `endpoint`'s responses."""
        endpoint.load, endpoint.load_observed_at = LoadScore.of(load), self.clock()
        endpoint.outstanding_at_load = endpoint.outstanding

    def served(self, endpoint: Endpoint, session: str | None, prefix: str | None) -> None:
        """`endpoint` served a request of `session` (and prompt prefix `prefix`): the next turn goes there too."""
        self.sessions.put(session, endpoint.address)
        self.prefixes.put(prefix, endpoint.address)

    @contextlib.contextmanager
    def track(self, endpoint: Endpoint):
        """Count a request as outstanding on `endpoint` for the duration of the block."""
        endpoint.outstanding += 1
        gauge = self.metrics.num_requests_outstanding.labels(endpoint.address)
        gauge.inc()
        try:
            yield endpoint
        finally:
            endpoint.outstanding -= 1
            gauge.dec()

    def eject(self, endpoint: Endpoint, reason: str) -> None:
        if endpoint.healthy:
            logger.warning("ejecting worker %s: %s", endpoint.address, reason)
        endpoint.healthy = False
        endpoint.load = None  # what comes back at this address reports afresh: picks fail open to p2c until it does
        self.metrics.worker_healthy.labels(endpoint.address).set(0)

    # -- health and discovery ----------------------------------------------------------------------------------

    async def probe_all(self) -> None:
        await asyncio.gather(*(self._probe(e) for e in list(self.endpoints.values())))

    async def _probe_each(self, endpoints: list[Endpoint]) -> None:
        await asyncio.gather(*(self._probe(e) for e in endpoints))

    async def _probe(self, endpoint: Endpoint) -> None:
        try:
            ready = await endpoint.client.is_ready(_PROBE_TIMEOUT_S)
            if ready and not endpoint.healthy:
                endpoint.models = await endpoint.client.model_info(_PROBE_TIMEOUT_S)
        except (grpc.aio.AioRpcError, WorkerError) as e:
            ready = False
            status = e.status if isinstance(e, WorkerError) else e.code().name
            if status == "UNAVAILABLE":  # refused / reset: no point waiting for a second probe
                endpoint.consecutive_failures = self.unhealthy_threshold
        if ready and endpoint.models:
            endpoint.consecutive_failures = 0
            if not endpoint.healthy:
                logger.info("admitting worker %s (models %s)", endpoint.address, sorted(endpoint.models))
                endpoint.healthy = True
                self.metrics.worker_healthy.labels(endpoint.address).set(1)
                self._changed.set()
            return
        endpoint.consecutive_failures += 1
        if endpoint.consecutive_failures >= self.unhealthy_threshold or not endpoint.healthy:
            self.eject(endpoint, "not ready" if not ready else "serves no model")

    async def wait_changed(self, timeout_s: float) -> None:
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await self.probe_all()

    async def _dns_loop(self) -> None:
        while True:
            await asyncio.sleep(self.dns_refresh_s)
            await self._resolve_dns()
            await asyncio.gather(*(self._probe(e) for e in self.endpoints.values() if not e.healthy))

    async def _resolve_dns(self) -> None:
        host, _, port = self.spec.removeprefix("dns://").rpartition(":")
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        except OSError as e:
            logger.warning("cannot resolve %s: %s (keeping %d known workers)", host, e, len(self.endpoints))
            return
        addresses = {
            f"[{info[4][0]}]:{port}" if info[0] == socket.AF_INET6 else f"{info[4][0]}:{port}" for info in infos
        }
        self.set_addresses(addresses, source="DNS")

    def _on_endpointslices(self, addresses: set[str]) -> None:
        added = self.set_addresses(addresses, source="the EndpointSlices")
        if added:  # probe now rather than at the next health tick: a new pod gets traffic within a probe
            task = asyncio.create_task(self._probe_each(added))
            self._tasks.append(task)
            task.add_done_callback(self._tasks.remove)

    def set_addresses(self, addresses: set[str], source: str) -> list[Endpoint]:
        """Make the pool hold exactly `addresses` (new ones unadmitted until probed); returns the new endpoints."""
        added = [self._add(address) for address in sorted(addresses - self.endpoints.keys())]
        for address in self.endpoints.keys() - addresses:
            endpoint = self.endpoints.pop(address)
            logger.info("worker %s left %s", address, source)
            with contextlib.suppress(KeyError):  # a vanished worker leaves no stale series behind
                self.metrics.worker_healthy.remove(address)
            asyncio.create_task(self._close_when_idle(endpoint))
        return added

    def _add(self, address: str) -> Endpoint:
        endpoint = self.endpoints[address] = Endpoint(address, self._make_client(address))
        self.metrics.worker_healthy.labels(address).set(0)
        return endpoint

    @staticmethod
    async def _close_when_idle(endpoint: Endpoint) -> None:
        while endpoint.outstanding:
            await asyncio.sleep(1.0)
        await endpoint.client.close()
