"""What a worker tells the gateway about its load, for routing by expected goodput (service/gateway/scoring.py).

The engine thread updates a `LoadTracker` after every step (no lock: each field is one float or int, written by
that thread only, and a reader on the event loop at worst sees the previous step's value). The worker sends a
snapshot (`LoadTracker.snapshot`, deepspec_protocol/worker.py `WorkerLoad`) as parameters of a request's first and last
responses, so a gateway that sends traffic learns the load of the workers it sends it to at no extra call, and
knows how old what it knows is.

- slots: running rows against the batch (`num_running / num_slots`), and the KV positions the running rows hold
  against what the batch's caches hold (`kv_utilization`);
- queue: requests waiting for a slot;
- speed: tokens a running row commits per second (an exponential moving average over steps: committed tokens of
  the step / rows / step time), and each service class's acceptance length τ (tokens per verify round that checked
  drafts, also averaged), so a gateway can tell where a class's requests are accepted best.
"""

from __future__ import annotations

from deepspec_protocol.worker import SERVICE_CLASSES, WorkerLoad

#: weight of the newest step in the moving averages: about the last 20 steps count
_EMA_WEIGHT = 0.05


def _averaged(previous: float, value: float) -> float:
    """The moving average after `value` (the first value as it is: 0 means nothing observed yet)."""
    return value if not previous else previous + _EMA_WEIGHT * (value - previous)


class LoadTracker:
    def __init__(self, num_slots: int, num_kv_positions: int):
        self.num_slots = num_slots
        #: KV positions the batch's caches hold (slots x context length)
        self.num_kv_positions = max(1, num_kv_positions)
        self.num_running = 0
        self.num_waiting = 0
        self.num_kv_used = 0
        self.row_tokens_per_s = 0.0
        self.rate_rows = 0.0
        self.acceptance: dict[str, float] = dict.fromkeys(SERVICE_CLASSES, 0.0)

    def observe_step(self, num_rows: int, num_committed: int, step_s: float) -> None:
        """One engine step: `num_rows` rows committed `num_committed` tokens in `step_s` seconds."""
        if num_rows <= 0 or step_s <= 0:
            return
        self.row_tokens_per_s = _averaged(self.row_tokens_per_s, num_committed / num_rows / step_s)
        self.rate_rows = _averaged(self.rate_rows, num_rows)

    def observe_round(self, service_class: str, num_accepted_tokens: int) -> None:
        """One verify round that checked drafts, of a row of `service_class`."""
        self.acceptance[service_class] = _averaged(self.acceptance.get(service_class, 0.0), 1.0 + num_accepted_tokens)

    def observe_occupancy(self, num_running: int, num_waiting: int, num_kv_used: int) -> None:
        self.num_running, self.num_waiting, self.num_kv_used = num_running, num_waiting, num_kv_used

    @property
    def kv_utilization(self) -> float:
        return min(1.0, self.num_kv_used / self.num_kv_positions)

    def snapshot(self) -> WorkerLoad:
        return WorkerLoad(
            num_running=self.num_running,
            num_waiting=self.num_waiting,
            num_slots=self.num_slots,
            kv_utilization=self.kv_utilization,
            row_tokens_per_s=self.row_tokens_per_s,
            rate_rows=self.rate_rows,
            acceptance={c: tau for c, tau in self.acceptance.items() if tau},
        )
