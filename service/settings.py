"""What every service process is configured with; the worker's and the gateway's own settings extend it.

`service.worker.settings.WorkerSettings` and `service.gateway.settings.GatewaySettings` are one typed model each,
unknown keys rejected. The CLI fills them from flags; every field can also come from the environment
(`DEEPSPEC_WORKER_PORT=8001`, `DEEPSPEC_GATEWAY_HTTP_PORT=8000`, and `DEEPSPEC_API_KEYS` for the keys). The apps take
an instance (`WorkerService(settings)`, `serve_gateway(settings)`, `create_app(settings)`), and tests pass their own.
The two live apart because they ship apart: the gateway image has no deepspec library, the worker's settings read
its defaults from it.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ServiceSettings(BaseSettings):
    model_config = SettingsConfigDict(extra="forbid")

    #: bind address
    host: str = "0.0.0.0"
    #: seconds to finish in-flight requests after SIGTERM (readiness turns false first)
    drain_timeout_s: float = Field(default=30.0, ge=0)
