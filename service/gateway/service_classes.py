"""Service classes: what each API key is promised, read from a keys file (or the chart's values, as JSON).

Every key has a policy: its `service_class` (deepspec_protocol/worker.py SERVICE_CLASSES: interactive before standard
before batch; the gateway admits and sheds by it, and the worker is told each row's class), a `weight` (its share of the
tokens served while keys of one class compete: 2 gets twice the tokens of 1), a `tokens_per_minute` budget (prompt +
completion tokens; 0 = none) and a `ttft_objective_s` (how long its requests may wait in the gateway's queue before
they are shed rather than served late). A key the file does not list, and every caller while auth is off, gets the
`default` policy.

The file is YAML (so JSON too):

    default: {service_class: standard}
    keys:
      sk-chat-frontend: {service_class: interactive, weight: 2, ttft_objective_s: 1.0}
      sk-nightly-evals: {service_class: batch, tokens_per_minute: 600000}
      sk-coding-agent: {service_class: interactive, session_memory: true}

Every key listed is an API key the gateway accepts, beside those of `--api-keys-file` / $DEEPSPEC_API_KEYS.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from deepspec_protocol.worker import DEFAULT_SERVICE_CLASS, SERVICE_CLASSES

#: SERVICE_CLASSES as a type, for pydantic to check a key's class against
ServiceClass = Literal["interactive", "standard", "batch"]
assert get_args(ServiceClass) == SERVICE_CLASSES  # the protocol's tuple is the one list of the names


class KeyPolicy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: admission and shedding order (interactive first, batch shed first); labels the acceptance metrics
    service_class: ServiceClass = DEFAULT_SERVICE_CLASS
    #: share of the served tokens among the keys of one class that have requests waiting
    weight: Annotated[float, Field(gt=0, le=1000)] = 1.0
    #: prompt + completion tokens a minute at most (a token bucket holding one minute's worth); 0 = no budget
    tokens_per_minute: Annotated[int, Field(ge=0)] = 0
    #: seconds a request may wait in the gateway's queue for a worker before it is shed (429 + Retry-After);
    #: None = the gateway's --queue-timeout-s
    ttft_objective_s: Annotated[float, Field(gt=0)] | None = None
    #: whether a request of this key that names a session (OpenAI's `user`, `x-session-id`, gRPC `session_id`) has the
    #: worker remember its answer and draft from the session's earlier ones (deepspec/decoding/session_memory.py);
    #: sessions of two keys never share memory
    session_memory: bool = False

    @property
    def rank(self) -> int:
        """0 for the most urgent class: the admission order."""
        return SERVICE_CLASSES.index(self.service_class)


class ServiceClassesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    default: KeyPolicy = KeyPolicy()
    keys: dict[str, KeyPolicy] = {}


def memory_session(caller: str | None, session: str | None, policy: KeyPolicy) -> str | None:
    """The session-memory key a worker is sent: the caller's digest and the client's session id, so one key's
    session id never reaches another key's memory; None where the policy does not opt in or there is no session."""
    if not policy.session_memory or not session:
        return None
    return f"{caller or 'anonymous'}:{session}"


def caller_id(key: str) -> str:
    """The caller identity the gateway derives from an API key (a digest: keys never sit in memory twice or in
    logs); `GatewayState.check_api_key` returns the same."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class ServiceClasses:
    """Each caller's policy; `policy(None)` (auth off) and unknown callers get the default."""

    def __init__(self, spec: ServiceClassesFile | None = None):
        spec = spec or ServiceClassesFile()
        self.default = spec.default
        self.keys = frozenset(spec.keys)
        self._by_caller = {caller_id(key): policy for key, policy in spec.keys.items()}

    def policy(self, caller: str | None) -> KeyPolicy:
        return self._by_caller.get(caller, self.default) if caller is not None else self.default

    @classmethod
    def load(cls, path: Path | None = None, inline: str = "") -> ServiceClasses:
        """From a YAML / JSON file, or from `inline` YAML / JSON text (the chart's values); ValueError naming the
        source and the field that is wrong."""
        if path is None and not inline.strip():
            return cls()
        source = str(path) if path is not None else "--service-classes"
        try:
            data = yaml.safe_load(path.read_text() if path is not None else inline)
            return cls(ServiceClassesFile.model_validate(data or {}))
        except (yaml.YAMLError, OSError) as e:
            raise ValueError(f"{source}: cannot read it: {e}") from None
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise ValueError(
                f"{source}: {where}: {first['msg']} (service classes are {', '.join(SERVICE_CLASSES)})"
            ) from None
