"""A stand-in for deepspec.neighbours.NeighbourShare whose share the test sets, not what else the machine runs: what
is kept or measured again after a busy-neighbour measurement must not depend on the load of the machine running the
tests."""

from __future__ import annotations

from deepspec.neighbours import BUSY_SHARE


class SetNeighbours:
    """NeighbourShare's interface; every instance reads the class's `share`."""

    share = 0.0

    def start(self) -> SetNeighbours:
        return self

    def stop(self) -> None:
        return None

    def __enter__(self) -> SetNeighbours:
        return self

    def __exit__(self, *exc) -> None:
        return None

    @property
    def busy(self) -> bool:
        return self.share >= BUSY_SHARE


def set_neighbours(monkeypatch, module) -> type[SetNeighbours]:
    """`module.NeighbourShare` replaced by SetNeighbours, quiet (share 0) until the test sets `.share`; both undone
    when the test ends."""
    monkeypatch.setattr(module, "NeighbourShare", SetNeighbours)
    monkeypatch.setattr(SetNeighbours, "share", 0.0)
    return SetNeighbours
