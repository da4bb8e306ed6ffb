"""The gateway's settings: workers to route to, its two APIs, keys and limits (see `service.settings` for how they
are filled). Nothing here needs the deepspec library: the gateway image does not have it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import SettingsConfigDict

from service.gateway.service_classes import ServiceClasses
from service.gateway.upstreams import parse_address
from service.settings import ServiceSettings

#: how the gateway finds its workers (--discovery)
Discovery = Literal["static", "dns", "endpointslices"]


class GatewaySettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="DEEPSPEC_GATEWAY_", extra="forbid", populate_by_name=True)

    #: "host:port,host:port", "dns://name:port" (a headless Service, re-resolved every `dns_refresh_s`) or
    #: "k8s://service[.namespace]:port-name-or-number" (its EndpointSlices, watched through the Kubernetes API).
    #: A static entry may name its protocol: "grpc://host:port" (KServe v2) or "openai+http://host:port" (an
    #: OpenAI-compatible server: vLLM, SGLang, trtllm-serve, llama.cpp); a bare host:port uses `worker_protocol`
    workers: str = ""
    #: what workers without a scheme speak (every DNS / EndpointSlices address): KServe v2 gRPC or OpenAI HTTP
    worker_protocol: Literal["kserve-grpc", "openai-http"] = "kserve-grpc"
    #: requests the gateway keeps in flight on one OpenAI worker at most (0 = no cap); past it the worker counts
    #: as saturated (retry elsewhere, 429 when all are): OpenAI engines queue without bound instead of refusing
    openai_max_outstanding: int = Field(default=0, ge=0)
    #: how `workers` is found; None = implied by its scheme (dns:// -> dns, k8s:// -> endpointslices, else static)
    discovery: Discovery | None = None
    #: Kubernetes API base URL for endpointslices discovery ("" = in-cluster: $KUBERNETES_SERVICE_HOST/_PORT)
    k8s_api_url: str = ""
    http_port: int = Field(default=8000, ge=0, le=65535)
    #: 0 = pick a free one, -1 = no gRPC API
    grpc_port: int = Field(default=50051, ge=-1, le=65535)
    #: file with one API key per line; keys also come from $DEEPSPEC_API_KEYS (comma-separated)
    api_keys_file: Path | None = None
    api_keys: str = Field(default="", validation_alias=AliasChoices("DEEPSPEC_API_KEYS", "api_keys"))
    #: whole-request limit, seconds (queueing + generation)
    request_timeout_s: float = Field(default=600.0, gt=0)
    #: seconds between ServerReady probes of each worker
    health_interval_s: float = Field(default=2.0, gt=0)
    #: consecutive failed probes before a worker is ejected (a refused connection ejects at once)
    unhealthy_threshold: int = Field(default=2, ge=1)
    dns_refresh_s: float = Field(default=5.0, gt=0)
    #: request bodies above this many bytes get 413
    max_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    #: tries per request across workers (before the first token only)
    max_attempts: int = Field(default=3, ge=1)
    #: seconds a 429 asks the client to wait (Retry-After)
    retry_after_s: int = Field(default=1, ge=1)
    #: Prometheus /metrics on its own port, away from the API and its Ingress (0 = any free; -1 = on the HTTP port)
    metrics_port: int = Field(default=-1, ge=-1, le=65535)
    #: per API key: service class, fair-share weight, tokens-per-minute budget and latency objective, as a YAML / JSON
    #: file (service/gateway/service_classes.py); its keys are accepted API keys too
    service_classes_file: Path | None = None
    #: the same as YAML / JSON text (the chart's values); the file wins where both are given
    service_classes: str = ""
    #: requests the gateway keeps in flight per admitted worker (0 = no cap of its own: it sends until the workers
    #: say they are saturated); past it they wait in the gateway's admission queue, most urgent class first
    max_inflight_per_worker: int = Field(default=0, ge=0)
    #: slots per worker past max_inflight_per_worker that only the interactive class may take (set the workers'
    #: --max-batch-size to the sum): batch traffic never fills them, so an interactive request starts at once
    interactive_reserve_per_worker: int = Field(default=0, ge=0)
    #: requests the admission queue holds (0 = none: a saturated pool answers 429 at once); past it the lowest class
    #: is shed (429, Retry-After, x-deepspec-drop-reason)
    max_waiting: int = Field(default=256, ge=0)
    #: seconds a request may wait in the admission queue when its key sets no ttft_objective_s
    queue_timeout_s: float = Field(default=30.0, gt=0)
    #: "goodput": score workers by the tokens/s a request would get (their reported load), keep sessions on their
    #: worker, prefer a prompt prefix's worker; "p2c": power of two choices on outstanding requests only
    routing: Literal["goodput", "p2c"] = "goodput"
    #: seconds a worker's load report stays fresh; past it the pick falls back to power of two choices
    routing_load_max_age_s: float = Field(default=5.0, gt=0)
    #: keep /health/ready at 200 while no worker is admitted (completions answer 503 + Retry-After): a worker
    #: outage then leaves every gateway in its Service instead of taking the whole API off the network
    ready_without_workers: bool = False

    @model_validator(mode="after")
    def _check_workers(self):
        """`--discovery` and the `--workers` scheme must agree; an explicit discovery may leave the scheme out."""
        schemes: dict[Discovery, str] = {"dns": "dns://", "endpointslices": "k8s://"}
        implied: Discovery = "static"
        for discovery, scheme in schemes.items():
            if self.workers.startswith(scheme):
                implied = discovery
                break
        if self.discovery is None:
            self.discovery = implied
        elif implied == "static" and self.discovery != "static":
            self.workers = schemes[self.discovery] + self.workers
        elif implied != self.discovery:
            raise ValueError(
                f"--discovery {self.discovery} does not match --workers {self.workers!r} "
                f"(which implies {implied}); drop one of them"
            )
        if self.discovery == "static":
            for address in filter(None, (a.strip() for a in self.workers.split(","))):
                parse_address(address)  # ValueError naming the valid forms
        elif self.discovery == "dns":
            host, _, port = self.workers.removeprefix("dns://").rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"expected dns://<name>:<port>, got {self.workers!r}")
        else:
            from service.gateway.discovery_k8s import KubeAPI, ServiceRef

            ref = ServiceRef.parse(self.workers)
            KubeAPI.in_cluster(url=self.k8s_api_url, namespace=ref.namespace or "")  # no API or namespace: fail now
        return self

    @model_validator(mode="after")
    def _check_keys_file(self):
        if self.api_keys_file is not None and not self.api_keys_file.is_file():
            raise ValueError(f"--api-keys-file {self.api_keys_file} does not exist or is not a file")
        return self

    @model_validator(mode="after")
    def _check_service_classes(self):
        if self.service_classes_file is not None and not self.service_classes_file.is_file():
            raise ValueError(f"--service-classes-file {self.service_classes_file} does not exist or is not a file")
        self.load_service_classes()  # ValueError naming the entry that is wrong
        return self

    def load_service_classes(self) -> ServiceClasses:
        return ServiceClasses.load(self.service_classes_file, "" if self.service_classes_file else self.service_classes)

    def load_api_keys(self) -> frozenset[str]:
        """Keys from the env var and the file (blank lines and '#' comments skipped); empty = auth off."""
        keys = {k.strip() for k in self.api_keys.split(",") if k.strip()}
        if self.api_keys_file is not None:
            for line in self.api_keys_file.read_text().splitlines():
                if line.strip() and not line.lstrip().startswith("#"):  # a line may hold several, comma-separated
                    keys.update(k.strip() for k in line.split(",") if k.strip())
        return frozenset(keys)
