"""EndpointSlices discovery against a fake Kubernetes API server: list, watch events, resume, 410 -> relist.

`FakeKubeAPI` is a FastAPI app on uvicorn in a background thread that serves the one path the gateway uses,
`/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices`, like the API server does: a list with a
`resourceVersion`, and `watch=true` streams of JSON lines that replay what happened after the requested version,
or answer 410 Gone when that version is older than the oldest one it keeps (`compact`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from service.gateway.discovery_k8s import SERVICE_NAME_LABEL, KubeAPI, ServiceRef, ready_addresses
from service.gateway.routing import WorkerPool, discovery_for
from service.gateway.settings import GatewaySettings
from service.metrics import GatewayMetrics
from tests.ports import free_port
from tests.service.conftest import Gateway, Worker

NAMESPACE, SERVICE = "test-ns", "deepspec-worker"


def endpoint_slice(
    name: str, ready: dict[str, bool | None], port: int = 8001, port_name: str = "grpc", address_type: str = "IPv4"
) -> dict:
    """An EndpointSlice of the worker Service; `ready` maps each pod IP to conditions.ready (None = absent)."""
    return {
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {SERVICE_NAME_LABEL: SERVICE}},
        "addressType": address_type,
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip], "conditions": {} if r is None else {"ready": r}} for ip, r in ready.items()],
    }


class FakeKubeAPI:
    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.rv = 100
        self.oldest_rv = 0  # a watch from an older resourceVersion gets 410 Gone
        self.slices: dict[str, dict] = {}
        self.history: list[dict] = []  # watch events, replayed to a watch that resumes from an older version
        self.requests: list[dict] = []
        self._watches: set[asyncio.Queue] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        app = FastAPI()
        app.get("/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices")(self._endpointslices)
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", timeout_graceful_shutdown=1)
        )
        self._thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> FakeKubeAPI:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started or self._loop is None:
            assert time.monotonic() < deadline, "the fake Kubernetes API did not start"
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"{self.url}/apis/discovery.k8s.io/v1/namespaces/x/endpointslices", timeout=1)
            time.sleep(0.05)
        self.requests.clear()
        return self

    def __exit__(self, *exc) -> None:
        self._call(self._end_watches)
        self.server.should_exit = True
        self._thread.join(10)

    # -- what a test does (from its own thread) ----------------------------------------------------------------

    def emit(self, kind: str, slice_: dict) -> None:
        """ADDED / MODIFIED / DELETED: change the store and tell every open watch."""
        self._call(self._emit, kind, json.loads(json.dumps(slice_)))

    def drop_watches(self) -> None:
        """Close every open watch stream, as an API server restart or a load balancer timeout does."""
        self._call(self._end_watches)

    def compact(self, error_event: bool) -> None:
        """Forget history: resuming from any version seen so far gets 410, as an ERROR event or a response."""
        self._call(self._compact, error_event)

    def watch_requests(self) -> list[dict]:
        return [r for r in self.requests if r.get("watch") == "true"]

    # -- the server side (its own event loop) ------------------------------------------------------------------

    def _call(self, fn, *args) -> None:
        done = threading.Event()

        def run():
            fn(*args)
            done.set()

        assert self._loop is not None, "the fake API server is not running"
        self._loop.call_soon_threadsafe(run)
        assert done.wait(5)

    def _emit(self, kind: str, slice_: dict) -> None:
        self.rv += 1
        slice_["metadata"]["resourceVersion"] = str(self.rv)
        if kind == "DELETED":
            self.slices.pop(slice_["metadata"]["name"], None)
        else:
            self.slices[slice_["metadata"]["name"]] = slice_
        event = {"type": kind, "object": slice_}
        self.history.append(event)
        for queue in self._watches:
            queue.put_nowait(event)

    def _end_watches(self) -> None:
        for queue in self._watches:
            queue.put_nowait(None)

    def _compact(self, error_event: bool) -> None:
        self.oldest_rv = self.rv + 1
        self.history.clear()
        gone = {
            "type": "ERROR",
            "object": {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"},
        }
        for queue in self._watches:
            if error_event:
                queue.put_nowait(gone)
            queue.put_nowait(None)

    async def _endpointslices(self, namespace: str, request: Request):
        self._loop = asyncio.get_running_loop()
        params = dict(request.query_params)
        self.requests.append({**params, "namespace": namespace, "authorization": request.headers.get("authorization")})
        if params.get("labelSelector") != f"{SERVICE_NAME_LABEL}={SERVICE}" or namespace != NAMESPACE:
            return {"kind": "EndpointSliceList", "metadata": {"resourceVersion": str(self.rv)}, "items": []}
        if params.get("watch") != "true":
            return {
                "kind": "EndpointSliceList",
                "metadata": {"resourceVersion": str(self.rv)},
                "items": list(self.slices.values()),
            }
        since = int(params["resourceVersion"])
        if since < self.oldest_rv:
            return JSONResponse({"kind": "Status", "code": 410, "reason": "Expired"}, status_code=410)
        queue: asyncio.Queue = asyncio.Queue()
        for event in self.history:
            if int(event["object"]["metadata"]["resourceVersion"]) > since:
                queue.put_nowait(event)
        self._watches.add(queue)

        async def stream():
            try:
                while (event := await queue.get()) is not None:
                    yield json.dumps(event) + "\n"
            finally:
                self._watches.discard(queue)

        return StreamingResponse(stream(), media_type="application/json")


@pytest.fixture
def kube():
    with FakeKubeAPI() as api:
        yield api


async def _until(check, timeout_s: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


# --- Units ----------------------------------------------------------------------------------------------------


def test_ready_addresses_take_ready_endpoints_on_the_named_or_numbered_port():
    s = endpoint_slice("a", {"10.0.0.1": True, "10.0.0.2": False, "10.0.0.3": None}, port=8001, port_name="grpc")
    assert ready_addresses(s, "grpc") == {"10.0.0.1:8001", "10.0.0.3:8001"}  # absent `ready` means ready
    assert ready_addresses(s, "8001") == {"10.0.0.1:8001", "10.0.0.3:8001"}
    assert ready_addresses(s, "metrics") == set() and ready_addresses(s, "8002") == set()
    v6 = endpoint_slice("b", {"fd00::1": True}, address_type="IPv6")
    assert ready_addresses(v6, "grpc") == {"[fd00::1]:8001"}
    assert ready_addresses({"metadata": {"name": "empty"}, "endpoints": None, "ports": None}, "grpc") == set()


def test_service_ref_and_discovery_come_from_the_workers_address():
    assert ServiceRef.parse("k8s://deepspec-worker:grpc") == ServiceRef("deepspec-worker", None, "grpc")
    assert ServiceRef.parse("k8s://deepspec-worker.prod:8001") == ServiceRef("deepspec-worker", "prod", "8001")
    for bad in ("k8s://w", "k8s://:grpc", "k8s://w.ns.svc.cluster.local:8001", "w:grpc"):
        with pytest.raises(ValueError, match="k8s://<service>"):
            ServiceRef.parse(bad)
    assert [discovery_for(w) for w in ("a:1,b:2", "dns://w:1", "k8s://w:grpc")] == ["static", "dns", "endpointslices"]


def test_in_cluster_config_reads_the_pod(tmp_path, monkeypatch):
    (tmp_path / "token").write_text("tok-1\n")
    (tmp_path / "namespace").write_text("from-file")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    api = KubeAPI.in_cluster(sa_dir=tmp_path)
    assert (api.url, api.namespace, api.ca_file) == ("https://10.96.0.1:443", "from-file", None)
    assert api.headers()["Authorization"] == "Bearer tok-1"
    (tmp_path / "token").write_text("tok-2")  # projected tokens rotate: read on every request
    assert api.headers()["Authorization"] == "Bearer tok-2"
    monkeypatch.setenv("POD_NAMESPACE", "from-env")
    assert KubeAPI.in_cluster(sa_dir=tmp_path).namespace == "from-env"
    assert KubeAPI.in_cluster(url="http://x:1/", namespace="flag", sa_dir=tmp_path).url == "http://x:1"
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    assert KubeAPI.in_cluster(sa_dir=tmp_path).url == "https://[fd00::1]:443"
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST")
    with pytest.raises(ValueError, match="--k8s-api-url"):
        KubeAPI.in_cluster(sa_dir=tmp_path)
    monkeypatch.delenv("POD_NAMESPACE")
    with pytest.raises(ValueError, match="POD_NAMESPACE"):
        KubeAPI.in_cluster(url="http://x:1", sa_dir=tmp_path / "absent")


def test_settings_discovery_flag_and_workers_scheme_agree(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert GatewaySettings(workers="a:1,b:2").discovery == "static"
    assert GatewaySettings(workers="dns://w:8001").discovery == "dns"
    s = GatewaySettings(workers="w.ns:grpc", discovery="endpointslices", k8s_api_url="http://127.0.0.1:1")
    assert (s.workers, s.discovery) == ("k8s://w.ns:grpc", "endpointslices")
    assert GatewaySettings(workers="w:8001", discovery="dns").workers == "dns://w:8001"
    with pytest.raises(ValueError, match="does not match"):
        GatewaySettings(workers="dns://w:8001", discovery="static")
    with pytest.raises(ValueError, match="KUBERNETES_SERVICE_HOST"):
        GatewaySettings(workers="k8s://w.ns:grpc")
    with pytest.raises(ValueError, match="dns://<name>:<port>"):
        GatewaySettings(workers="w:grpc", discovery="dns")


# --- The watcher feeding the pool ---------------------------------------------------------------------------


def test_pool_follows_list_watch_resume_and_relist(kube: FakeKubeAPI):
    """Nobody listens on 127.0.0.x:1, so every endpoint stays unadmitted: this is about the address set."""
    kube.emit("ADDED", endpoint_slice("w-a", {"127.0.0.2": True, "127.0.0.3": False}, port=1))

    async def main():
        pool = WorkerPool(
            f"k8s://{SERVICE}.{NAMESPACE}:grpc", GatewayMetrics(), health_interval_s=60, k8s_api_url=kube.url
        )
        await pool.start()

        def addresses(*want):
            return lambda: set(pool.endpoints) == set(want)

        try:
            await _until(addresses("127.0.0.2:1"), what="the listed ready endpoint")
            listed = kube.requests[0]
            assert "watch" not in listed and listed["labelSelector"] == f"{SERVICE_NAME_LABEL}={SERVICE}"
            await _until(lambda: kube.watch_requests(), what="the watch")
            assert kube.watch_requests()[0]["resourceVersion"] == "101"  # from the list
            assert kube.requests[0]["authorization"] is None  # no service-account token outside a pod

            # Watch events: a pod turns ready, a second slice appears, the first slice is deleted.
            kube.emit("MODIFIED", endpoint_slice("w-a", {"127.0.0.2": True, "127.0.0.3": True}, port=1))
            await _until(addresses("127.0.0.2:1", "127.0.0.3:1"), what="MODIFIED")
            kube.emit("ADDED", endpoint_slice("w-b", {"127.0.0.4": True}, port=1))
            await _until(addresses("127.0.0.2:1", "127.0.0.3:1", "127.0.0.4:1"), what="ADDED")
            kube.emit("DELETED", endpoint_slice("w-a", {}, port=1))
            await _until(addresses("127.0.0.4:1"), what="DELETED")

            # A dropped watch resumes from the last version it saw and gets what happened meanwhile.
            num_watches = len(kube.watch_requests())
            kube.drop_watches()
            kube.emit("ADDED", endpoint_slice("w-c", {"127.0.0.5": True}, port=1))
            await _until(addresses("127.0.0.4:1", "127.0.0.5:1"), what="the resumed watch")
            resumed = kube.watch_requests()[num_watches]
            assert resumed["resourceVersion"] == "104"  # the DELETED event's version, not a relist
            assert len(kube.requests) - len(kube.watch_requests()) == 1  # still one list

            # 410 Gone as an ERROR event in the stream, then as the response: list again, both times.
            for error_event, w_b_ready, want in (
                (True, False, ["127.0.0.5:1"]),
                (False, True, ["127.0.0.4:1", "127.0.0.5:1"]),
            ):
                num_lists = len(kube.requests) - len(kube.watch_requests())
                kube.compact(error_event=error_event)
                kube.emit("MODIFIED", endpoint_slice("w-b", {"127.0.0.4": w_b_ready}, port=1))
                await _until(addresses(*want), what=f"the relist (error_event={error_event})")
                assert len(kube.requests) - len(kube.watch_requests()) == num_lists + 1
        finally:
            await pool.stop()

    asyncio.run(main())


def test_watcher_survives_an_unreachable_api_and_keeps_its_workers():
    async def main():
        pool = WorkerPool(
            f"k8s://{SERVICE}.{NAMESPACE}:grpc",
            GatewayMetrics(),
            health_interval_s=60,
            k8s_api_url=f"http://127.0.0.1:{free_port()}",
        )
        await pool.start()
        await asyncio.sleep(0.3)
        assert pool.endpoints == {} and not any(t.done() for t in pool._tasks)  # retrying with backoff
        await pool.stop()

    asyncio.run(main())


# --- A real gateway process ---------------------------------------------------------------------------------


def test_gateway_routes_to_workers_from_endpointslices(tmp_path, kube: FakeKubeAPI):
    worker = Worker(tmp_path).start().wait_ready()
    kube.emit("ADDED", endpoint_slice("w-a", {"127.0.0.1": True}, port=worker.port))
    gw = Gateway(
        tmp_path, f"{SERVICE}.{NAMESPACE}:grpc", "--discovery", "endpointslices", "--k8s-api-url", kube.url
    ).start()
    try:
        gw.wait_ready()
        r = httpx.post(f"{gw.url}/v1/completions", json={"prompt": "x", "max_tokens": 3})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == "The"
        # The pod turns not-ready (terminating): it leaves the pool and the gateway has no worker left.
        kube.emit("MODIFIED", endpoint_slice("w-a", {"127.0.0.1": False}, port=worker.port))
        gw.wait_until(lambda: httpx.get(f"{gw.url}/health/ready", timeout=1).status_code == 503, 10, "unready")
    finally:
        gw.terminate()
        worker.terminate()
