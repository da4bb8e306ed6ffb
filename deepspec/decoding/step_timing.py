"""Where the verification budget's step curve comes from: a probe, the passes actually served, and a file per machine.

The budget (deepspec/decoding/planner.py) prices each round with t(n), the seconds of a verify pass over n tokens.
A curve timed once at start decides for the worker's whole life, and one probe is at the mercy of whatever else the
machine does in those milliseconds: the same worker probed {1: 10.3, 2: 16.4, 8: 16.4 ms} once and {1: 4.8, 2: 5.2,
8: 11.6 ms} on a quiet start, and served a different product each time. So the curve has three sources, each
correcting the one before:

1. `probe_step_curve`: passes of 1 .. max_verify_tokens tokens timed before any request, sizes interleaved over
   PROBE_ROUNDS rounds and the fastest of each kept (load only ever slows a pass), plus the attention a token pays
   per context key. Run once per target and shape in a process.
2. `ServedSteps`: every verify pass the engine serves on a CPU target is a measurement of t at its size. Each size
   keeps its last SERVED_WINDOW passes; the corrected curve takes, per served size, the median of those passes with the
   probe's value counted PROBE_WEIGHT times (two passes outvote it), and scales the sizes not served yet by the
   served/probed ratio of the served sizes around them.
   A median ignores the odd slow pass (a neighbour's burst), and a few passes outvote a disturbed probe.
3. `StepCurveCache`: the corrected curve saved in the cache directory under the target and this machine's key, so
   the next start on this machine begins from what the last one served, not from a new probe.

Passes on a GPU are asynchronous (the forward returns before the kernels finish), so only CPU targets feed
`ServedSteps`; a GPU target keeps its probed curve.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import time
import weakref
from collections import deque
from pathlib import Path

import torch

from deepspec.decoding.verify import RowSampling, verify
from deepspec.decoding.verify_budget import StepTimeModel, _interpolate_float

logger = logging.getLogger(__name__)

#: rounds over all probed sizes; each size keeps its fastest pass
PROBE_ROUNDS = 3
#: context positions the attention probe passes after (`probe_step_curve`)
CONTEXT_PROBE = 256
#: served passes kept per size (the newest)
SERVED_WINDOW = 32
#: how many served passes the probe's own value counts as in a size's median
PROBE_WEIGHT = 1
#: served passes between two refits of the corrected curve
REFIT_EVERY = 8
#: refits between two writes of the cache file
SAVE_EVERY = 16
#: target -> {(verify sizes, captured layers): its probed StepTimeModel}; dropped with the target
_PROBED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: target -> {draft width: probe_verify_overhead's seconds by sampling mode}; dropped with the target
_VERIFY_OVERHEADS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def clock() -> float:
    """Seconds, for every timing here and of the engine's passes (tests replace it with a clock they advance)."""
    return time.perf_counter()


def probe_sizes(max_verify_tokens: int, max_seq_len: int) -> tuple[int, ...]:
    """The pass sizes a probe times: powers of two up to max_verify_tokens, and max_verify_tokens itself."""
    limit = min(max_verify_tokens, max_seq_len - 1)
    return tuple(sorted({n for n in (1, 2, 4, 8, 16, 32, max_verify_tokens) if n <= limit} | {1, 2}))


def probe_step_curve(
    target, cache, sizes: tuple[int, ...], feature_layers: tuple[int, ...], max_seq_len: int
) -> StepTimeModel:
    """t(n) at `sizes` from verify-shaped passes on row 0 of `cache` (what they write there is overwritten by the first
    prefill), and the attention per (token, context key); cached per target, sizes and captured layers."""
    measured = _PROBED.setdefault(target, {})
    key = (sizes, feature_layers)
    if key not in measured:
        with torch.inference_mode():
            _timed_pass(target, cache, sizes[-1], 0, feature_layers)  # one-time kernel setup stays out
            fastest = {n: float("inf") for n in sizes}
            for _ in range(PROBE_ROUNDS):  # interleaved: a slow spell of the machine spreads over every size
                for n in sizes:
                    fastest[n] = min(fastest[n], _timed_pass(target, cache, n, 0, feature_layers))
            per_key = _attention_per_key_query(target, cache, fastest, feature_layers, max_seq_len)
        measured[key] = StepTimeModel(sorted(fastest.items()), target.multi_token_rows_serial, per_key)
    return measured[key]


def _attention_per_key_query(
    target, cache, after_nothing: dict[int, float], feature_layers: tuple[int, ...], max_seq_len: int
) -> float:
    """Seconds of attention per (verified token, context key): a pass of n tokens after CONTEXT_PROBE positions against
    the same pass after none (StepTimeModel.at_context). 0 on a target whose rows run serially (its recorded curve
    is timed after a context already) or a cache too short to tell."""
    n = max(k for k in after_nothing if k <= 8)
    context = min(CONTEXT_PROBE, max_seq_len - n - 1)
    if context < 64 or target.multi_token_rows_serial:
        return 0.0
    after = min(_timed_pass(target, cache, n, context, feature_layers) for _ in range(PROBE_ROUNDS))
    return max(0.0, (after - after_nothing[n]) / (n * context))


def _timed_pass(target, cache, n: int, start: int, feature_layers: tuple[int, ...]) -> float:
    """Seconds of one verify-shaped pass of n tokens at position `start` of the cache's row 0."""
    device = target.device
    tokens = torch.zeros(1, n, dtype=torch.long, device=device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = clock()
    target.forward(
        tokens,
        torch.full((1,), start, dtype=torch.long, device=device),
        cache.rows(0, 1),
        feature_layers=feature_layers,
        logits="all",
        max_start=start,
    )
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return clock() - t0


def probe_verify_overhead(target, width: int) -> dict[bool, float]:
    """{sampled: seconds the acceptance op costs a round over `width` drafts beyond a target-only round}, >= 0, on
    logits of the target's vocabulary (drafts rejected at their first slot, as most are where drafting is in doubt);
    the fastest of five runs each. Why: at temperature 1 the sampled op's general path costs ~0.6 ms a round at batch
    1 more than its target-only path, which the step curve does not hold. Measured once per target and width."""
    measured = _VERIFY_OVERHEADS.setdefault(target, {})
    if width not in measured:
        measured[width] = _time_verify_overhead(target.vocab_size, width, target.device)
    return measured[width]


@torch.inference_mode()
def _time_verify_overhead(vocab: int, k: int, device: torch.device) -> dict[bool, float]:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, k + 1, vocab, generator=g).to(device)
    drafts = torch.randint(vocab, (1, k), generator=g).to(device)
    sampled = RowSampling(
        torch.ones(1, device=device),
        torch.zeros(1, dtype=torch.long, device=device),
        torch.ones(1, device=device),
        torch.zeros(1, dtype=torch.long, device=device),
    )

    def fastest(width: int, sampling: RowSampling | None) -> float:
        runs = []
        for _ in range(6):  # the first run (imports, allocations) is dropped
            t0 = clock()
            num_accepted, _ = verify(drafts[:, :width], torch.tensor([width]), logits[:, : width + 1], None, sampling)
            int(num_accepted[0])  # the result on the host, as the round reads it
            runs.append(clock() - t0)
        return min(runs[1:])

    return {
        mode: max(0.0, fastest(k, sampling) - fastest(0, sampling))
        for mode, sampling in ((False, None), (True, sampled))
    }


class ServedSteps:
    """The verify passes an engine served, by token count: what corrects a probed or cached curve (module docstring).

    `add` takes a pass's seconds with its attention over the context already taken off (the curve's own
    per-key price), so passes at different context lengths measure the same t(n)."""

    def __init__(self, window: int = SERVED_WINDOW):
        self.window = window
        self._passes: dict[int, deque[float]] = {}
        #: passes added since the last refit (`due`)
        self.num_new = 0

    def add(self, num_tokens: int, seconds: float) -> None:
        self._passes.setdefault(int(num_tokens), deque(maxlen=self.window)).append(max(seconds, 1e-6))
        self.num_new += 1

    def count(self, num_tokens: int) -> int:
        return len(self._passes.get(int(num_tokens), ()))

    def due(self) -> bool:
        """Whether enough passes came in since the last refit to refit the curve."""
        return self.num_new >= REFIT_EVERY

    def corrected(self, base: StepTimeModel) -> StepTimeModel:
        """`base` corrected by the served passes: per served size the median of its passes with base's value there
        counted PROBE_WEIGHT times; each size of `base` no pass has measured, scaled by the served/base ratio of the
        served sizes around it (interpolated in n, the nearest one's beyond them): a machine slower or faster than
        the probe saw is so at the neighbouring sizes too."""
        self.num_new = 0
        served = {
            n: statistics.median(list(passes) + [base.seconds(n)] * PROBE_WEIGHT)
            for n, passes in sorted(self._passes.items())
        }
        if not served:
            return base
        sizes = [float(n) for n in served]
        ratios = [t / base.seconds(n) for n, t in served.items()]
        points = {}
        for n, t in zip(base.sizes.tolist(), base.times.tolist()):
            if len(sizes) == 1:
                points[int(n)] = t * ratios[0]
            else:
                points[int(n)] = t * _interpolate_float(min(max(n, sizes[0]), sizes[-1]), sizes, ratios)
        points.update(served)
        return StepTimeModel(sorted(points.items()), base.rows_serial, base.per_key_query)


class StepCurveCache:
    """A corrected step curve kept on disk per target, captured layers and machine (module docstring): JSON with the
    machine key, the curve in ms and the attention price; a file from another machine, thread count or target, or an
    unreadable one, is ignored (logged) and replaced on the next save."""

    def __init__(self, path: Path, identity: dict):
        self.path = Path(path)
        self.identity = identity

    @classmethod
    def for_target(cls, target, feature_layers: tuple[int, ...], threads: int | None = None) -> StepCurveCache:
        """The cache file of this target on this machine, under the cache directory (DEEPSPEC_CACHE_DIR)."""
        from deepspec.models.step_curve import machine_key
        from deepspec.paths import cache_dir

        identity = {
            "target": str(target.name),
            "fingerprint": target.fingerprint(),
            "kind": type(target).__name__,
            "quantization": str(target.quantization),
            "feature_layers": list(feature_layers),
            "machine": machine_key(threads),
        }
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
        return cls(cache_dir() / "step_curves" / f"{digest}.json", identity)

    def load(self, rows_serial: bool) -> StepTimeModel | None:
        try:
            record = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            logger.warning("ignoring the unreadable step-curve cache %s: %s", self.path, e)
            return None
        if not isinstance(record, dict) or record.get("identity") != self.identity:
            return None
        try:
            points = sorted((int(n), float(ms) / 1e3) for n, ms in record["ms"].items())
            return StepTimeModel(points, rows_serial, float(record.get("per_key_query_ns", 0.0)) / 1e9)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            logger.warning("ignoring the malformed step-curve cache %s: %s", self.path, e)
            return None

    def save(self, model: StepTimeModel) -> None:
        """Write `model` atomically (a reader never sees half a file); a failure to write is logged, not raised:
        the cache only saves the next start a probe."""
        record = {
            "identity": self.identity,
            "ms": {str(int(n)): round(t * 1e3, 4) for n, t in zip(model.sizes.tolist(), model.times.tolist())},
            "per_key_query_ns": model.per_key_query * 1e9,
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(record, indent=1) + "\n")
            tmp.replace(self.path)
        except OSError as e:
            logger.warning("could not save the step curve to %s: %s", self.path, e)
