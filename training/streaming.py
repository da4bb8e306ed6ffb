"""Keep every slot of an engine busy over a long queue of requests, handing each result back the moment it finishes.

`prepare` and `synth` generate tens of thousands of short answers. Handing the engine a fixed batch and waiting for
its longest row leaves slots idle at the end of every batch; here a freed slot takes the next request at once
(continuous batching), and the caller can queue follow-ups while results stream (the next turn of a multi-turn
row). Only the engine's public API is used: `add_request` and `step`; the stream counts its own slots.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field


@dataclass
class Finished:
    """One request's outcome: its tokens and text, or the error that refused it (`error` set, nothing generated)."""

    key: Hashable
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    error: Exception | None = None


class EngineStream:
    """`submit` requests (or let `refill` submit them lazily); iterate `run()` for their results as they finish."""

    def __init__(self, engine, slots: int):
        self.engine, self.slots = engine, slots
        self._queue: deque = deque()
        self._running: dict[str, Finished] = {}
        self._ids = itertools.count()

    @property
    def num_in_flight(self) -> int:
        return len(self._running) + len(self._queue)

    def submit(self, key: Hashable, prompt_ids: list[int], params) -> None:
        self._queue.append((key, prompt_ids, params))

    def run(self, refill: Callable[[], bool] = lambda: False) -> Iterator[Finished]:
        """Results until nothing is queued, nothing runs and `refill()` (which submits one more request and says
        whether it did) has no more. A request the engine refuses (too long, bad parameters) comes back with its
        error instead of stopping the run."""
        while True:
            yield from self._admit(refill)
            if not self._running:
                if self._queue or refill():
                    continue
                return
            for out in self.engine.step():
                record = self._running.get(out.request_id)
                if record is None:
                    continue
                record.token_ids.extend(out.new_token_ids)
                record.text += out.new_text
                if out.finished:
                    record.finish_reason = out.finish_reason
                    yield self._running.pop(out.request_id)

    def _admit(self, refill: Callable[[], bool]) -> Iterator[Finished]:
        while len(self._running) < self.slots and (self._queue or refill()):
            key, prompt_ids, params = self._queue.popleft()
            request_id = f"stream-{next(self._ids)}"
            try:
                self.engine.add_request(request_id, prompt_ids, params)
            except ValueError as exc:  # RequestError: the request, not the run, is at fault
                yield Finished(key, error=exc)
                continue
            self._running[request_id] = Finished(key)
