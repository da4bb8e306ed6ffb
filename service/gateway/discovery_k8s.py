"""Worker discovery by watching the worker Service's EndpointSlices through the Kubernetes API (from inside a pod).

Contract: `EndpointSliceWatcher.run()` lists `discovery.k8s.io/v1` EndpointSlices labelled
`kubernetes.io/service-name=<service>`, then watches them from the list's `resourceVersion`, and calls
`on_change(addresses)` with the full set of `host:port` of ready endpoints whenever it changes. It only reads the
API: health checks and routing stay in `routing.WorkerPool`, which treats this set like a DNS answer.

- Ready means `conditions.ready` is true (or absent, which the API defines as ready); a terminating pod turns
  not-ready and leaves the set, and the pool lets its in-flight requests finish.
- The port is the named (or numbered) port of the slice: EndpointSlice ports carry the Service port's name and the
  target port's number, so `k8s://deepspec-worker:grpc` is the robust spelling.
- A dropped watch resumes from the last seen `resourceVersion` after a backoff (0.5 s doubling to 30 s); a
  `410 Gone` (as a response or as an ERROR event) means the version was compacted away: list again.
- No kubernetes client library: in-cluster config is the service-account token (re-read on every request, since
  projected tokens rotate), its CA, and `KUBERNETES_SERVICE_HOST`/`_PORT`. Tests point `api_url` at a fake server.

RBAC: get/list/watch on `endpointslices` in the namespace (the chart's `role-gateway.yaml`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

logger = logging.getLogger(__name__)

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
#: seconds the API server holds one watch open before ending it cleanly (we then resume)
_WATCH_TIMEOUT_S = 290
_BACKOFF_MIN_S, _BACKOFF_MAX_S = 0.5, 30.0


class GoneError(Exception):
    """The watched resourceVersion is too old (HTTP 410): list again."""


@dataclass(frozen=True)
class ServiceRef:
    """`k8s://<service>[.<namespace>]:<port-name-or-number>` — what the gateway's `--workers` says."""

    service: str
    namespace: str | None
    port: str

    @classmethod
    def parse(cls, spec: str) -> ServiceRef:
        host, _, port = spec.removeprefix("k8s://").rpartition(":")
        service, _, namespace = host.partition(".")
        if not spec.startswith("k8s://") or not service or not port or "." in namespace:
            raise ValueError(f"expected k8s://<service>[.<namespace>]:<port-name-or-number>, got {spec!r}")
        return cls(service, namespace or None, port)


@dataclass(frozen=True)
class KubeAPI:
    """Where and how to reach the API server: in-cluster defaults, each overridable (tests, out-of-cluster runs)."""

    url: str
    namespace: str
    token_file: Path | None = None
    ca_file: Path | None = None

    @classmethod
    def in_cluster(cls, url: str = "", namespace: str = "", sa_dir: Path = SERVICE_ACCOUNT_DIR) -> KubeAPI:
        """Fill what is not given from the pod: env `KUBERNETES_SERVICE_HOST`/`_PORT`, `POD_NAMESPACE`, the SA files."""
        if not url:
            host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise ValueError(
                    "--discovery endpointslices needs the Kubernetes API: KUBERNETES_SERVICE_HOST is "
                    "unset (not in a pod?); pass --k8s-api-url (or $DEEPSPEC_GATEWAY_K8S_API_URL)"
                )
            url = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        if not namespace:
            namespace = os.environ.get("POD_NAMESPACE", "")
        if not namespace and (sa_dir / "namespace").is_file():
            namespace = (sa_dir / "namespace").read_text().strip()
        if not namespace:
            raise ValueError(
                f"no namespace for the worker Service: not in --workers k8s://<service>.<namespace>:"
                f"<port>, $POD_NAMESPACE or {sa_dir / 'namespace'}"
            )
        token, ca = sa_dir / "token", sa_dir / "ca.crt"
        return cls(url.rstrip("/"), namespace, token if token.is_file() else None, ca if ca.is_file() else None)

    def client(self, timeout: httpx.Timeout) -> httpx.AsyncClient:
        verify: str | bool = str(self.ca_file) if self.ca_file else True
        return httpx.AsyncClient(base_url=self.url, verify=verify, timeout=timeout)

    def headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.token_file is not None:
            headers["Authorization"] = f"Bearer {self.token_file.read_text().strip()}"
        return headers


def ready_addresses(slice_: dict, port: str) -> set[str]:
    """`host:port` of every ready endpoint in one EndpointSlice that exposes `port` (a name or a number)."""
    numbers = [
        p.get("port")
        for p in slice_.get("ports") or []
        if p.get("port") is not None and (p.get("name") == port or str(p.get("port")) == port)
    ]
    if not numbers:
        return set()
    ipv6 = slice_.get("addressType") == "IPv6"
    out = set()
    for endpoint in slice_.get("endpoints") or []:
        if endpoint.get("conditions", {}).get("ready") is False or not endpoint.get("addresses"):
            continue  # absent `ready` means ready (API docs); terminating endpoints report ready=false
        address = endpoint["addresses"][0]  # "fungible, clients may choose to only use the first element"
        out.add(f"[{address}]:{numbers[0]}" if ipv6 else f"{address}:{numbers[0]}")
    return out


class EndpointSliceWatcher:
    def __init__(
        self,
        api: KubeAPI,
        ref: ServiceRef,
        on_change: Callable[[set[str]], None],
        watch_timeout_s: int = _WATCH_TIMEOUT_S,
        backoff_min_s: float = _BACKOFF_MIN_S,
    ):
        self.api, self.ref, self.on_change = api, ref, on_change
        self.watch_timeout_s = watch_timeout_s
        self.backoff_min_s = backoff_min_s
        #: EndpointSlice name -> its ready addresses
        self.slices: dict[str, set[str]] = {}
        self.resource_version = ""
        self._published: set[str] | None = None
        self.path = f"/apis/discovery.k8s.io/v1/namespaces/{api.namespace}/endpointslices"
        self.selector = f"{SERVICE_NAME_LABEL}={ref.service}"

    @property
    def addresses(self) -> set[str]:
        return set().union(*self.slices.values())

    async def run(self) -> None:
        """List, then watch forever; reconnect with backoff, relist on 410. Cancel to stop."""
        backoff = self.backoff_min_s
        timeout = httpx.Timeout(10.0, read=self.watch_timeout_s + 30.0)
        async with self.api.client(timeout) as client:
            while True:
                started = asyncio.get_running_loop().time()
                try:
                    if not self.resource_version:
                        await self._list(client)
                    await self._watch(client)
                    if asyncio.get_running_loop().time() - started >= 1.0:
                        backoff = self.backoff_min_s  # a watch that ran and ended cleanly: resume at once
                        continue
                except GoneError:
                    logger.info(
                        "EndpointSlices of %s: resourceVersion %s expired, listing again",
                        self.ref.service,
                        self.resource_version,
                    )
                    self.resource_version = ""
                    continue
                except (httpx.HTTPError, ValueError) as e:  # ValueError: a malformed body or event
                    logger.warning(
                        "EndpointSlices of %s: %s: %s (retrying in %.1f s, keeping %d workers)",
                        self.ref.service,
                        type(e).__name__,
                        e,
                        backoff,
                        len(self.addresses),
                    )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX_S)

    async def _list(self, client: httpx.AsyncClient) -> None:
        r = await client.get(self.path, params={"labelSelector": self.selector}, headers=self.api.headers())
        _raise_for_status(r)
        body = r.json()
        self.slices = {s["metadata"]["name"]: ready_addresses(s, self.ref.port) for s in body.get("items") or []}
        self.resource_version = body["metadata"]["resourceVersion"]
        self._publish()

    async def _watch(self, client: httpx.AsyncClient) -> None:
        params = {
            "labelSelector": self.selector,
            "watch": "true",
            "resourceVersion": self.resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self.watch_timeout_s),
        }
        async with client.stream("GET", self.path, params=params, headers=self.api.headers()) as r:
            if r.status_code >= 400:
                await r.aread()
                _raise_for_status(r)
            async for line in r.aiter_lines():
                if line.strip():
                    self._apply(json.loads(line))

    def _apply(self, event: dict) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise GoneError(obj.get("message", ""))
            raise ValueError(f"watch error event: {obj.get('message', obj)}")
        name = obj["metadata"]["name"]
        if kind in ("ADDED", "MODIFIED"):
            self.slices[name] = ready_addresses(obj, self.ref.port)
        elif kind == "DELETED":
            self.slices.pop(name, None)
        # BOOKMARK carries only a newer resourceVersion
        self.resource_version = obj["metadata"].get("resourceVersion", self.resource_version)
        self._publish()

    def _publish(self) -> None:
        addresses = self.addresses
        if addresses != self._published:
            self._published = addresses
            logger.info("EndpointSlices of %s: %d ready workers", self.ref.service, len(addresses))
            self.on_change(addresses)


def _raise_for_status(r: httpx.Response) -> None:
    if r.status_code == 410:
        raise GoneError(r.text)
    if r.status_code in (401, 403):
        raise httpx.HTTPStatusError(
            f"{r.status_code} from the Kubernetes API: the gateway's ServiceAccount needs "
            f"list/watch on endpointslices in its namespace ({r.text[:200]})",
            request=r.request,
            response=r,
        )
    r.raise_for_status()
