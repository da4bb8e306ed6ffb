"""Where the verification budget's step curve comes from: a probe, the passes actually served, and a file per machine.

The budget (deepspec/decoding/planner.py) prices each round with t(rows, n), the seconds of a verify pass over `rows`
rows holding n tokens in all (verify_budget.StepTimeModel: a curve per row count; deepspec/decoding/DESIGN.md, "The
budget's step model"). A curve timed once at start decides for the worker's whole life, and one probe is at the
mercy of whatever else the machine does in those milliseconds: the same worker probed {1: 10.3, 2: 16.4, 8: 16.4 ms}
once and {1: 4.8, 2: 5.2, 8: 11.6 ms} on a quiet start, and served a different product each time. So the curves have
three sources, each correcting the one before:

1. `probe_step_curve`: one-row passes of 1 .. max_verify_tokens tokens and passes over 2, 4, .. up to the batch's rows
   (`probe_rows`, `row_probe_sizes`; after a context) timed before any request, shapes interleaved over PROBE_ROUNDS
   rounds and the fastest of each kept (load only ever slows a pass), plus the attention a token pays per context
   key. Run once per target and shape in a process.
2. `ServedSteps`: every verify pass the engine serves on a CPU target is a measurement of t at its rows and size.
   Each (rows, size) keeps its last SERVED_WINDOW passes; the corrected curves take, per served cell, the median of
   those passes with the probe's value counted PROBE_WEIGHT times (two passes outvote it), scale the sizes not served
   yet by how the served ones compare at that row count, and past the last served size follow the served slope
   (`_served_ratio`). A median ignores the odd slow pass (a neighbour's burst), and a few passes outvote a disturbed
   probe.
3. `StepCurveCache`: the corrected curves saved in the cache directory under the target and this machine's key, so
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
#: the cache file's layout (StepCurveCache): 2 since it holds multi-row curves
CACHE_FORMAT = 2
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


def probe_rows(max_batch_size: int, max_verify_tokens: int, rows_serial: bool) -> tuple[int, ...]:
    """The row counts beyond one a probe times: powers of two up to the most rows that can still draft a token each
    (max_verify_tokens // 2) or the batch's size where smaller, and that limit itself; none on a target whose rows
    run serially (a pass of B rows is B one-row passes there, StepTimeModel.rows_serial)."""
    limit = min(max_batch_size, max_verify_tokens // 2)
    if rows_serial or limit < 2:
        return ()
    return tuple(sorted({r for r in (2, 4, 8, 16, 32) if r <= limit} | {limit}))


def row_probe_sizes(rows: int, max_verify_tokens: int, num_speculative_tokens: int, ragged: bool) -> tuple[int, ...]:
    """The total token counts a probe times a pass of `rows` rows at: one, two and four tokens a row and the most a
    round verifies there (the engine's per-row budget, engine._draft_caps), and, on a target that verifies ragged
    rows, one draft more than a token a row: the first draft of a batch is where a multi-row pass's cost jumps."""
    cap = rows * max(1, min(max_verify_tokens // rows, num_speculative_tokens + 1))
    sizes = {rows * per_row for per_row in (1, 2, 4)} | {cap} | ({rows + 1} if ragged else set())
    return tuple(sorted(n for n in sizes if rows <= n <= cap))


def probe_step_curve(
    target,
    cache,
    sizes: tuple[int, ...],
    feature_layers: tuple[int, ...],
    max_seq_len: int,
    row_sizes: dict[int, tuple[int, ...]] | None = None,
) -> StepTimeModel:
    """t(n) at `sizes` from verify-shaped passes on row 0 of `cache` (what they write there is overwritten by the first
    prefill), the attention per (token, context key), and t(rows, n) at `row_sizes` ({rows: total tokens}) from passes
    over rows 0 .. rows - 1 (`_row_curves`); cached per target, sizes and captured layers."""
    measured = _PROBED.setdefault(target, {})
    row_sizes = {r: n for r, n in (row_sizes or {}).items() if n and r > 1}
    key = (sizes, feature_layers, tuple(sorted(row_sizes.items())))
    if key not in measured:
        with torch.inference_mode():
            _timed_pass(target, cache, sizes[-1], 0, feature_layers)  # one-time kernel setup stays out
            one_row = {n: t for (_, n), t in _fastest_passes(target, cache, [(1, n) for n in sizes], 0, feature_layers)}
            per_key = _attention_per_key_query(target, cache, one_row, feature_layers, max_seq_len)
            by_rows = _row_curves(target, cache, row_sizes, feature_layers, max_seq_len, per_key)
        measured[key] = StepTimeModel(sorted(one_row.items()), target.multi_token_rows_serial, per_key, by_rows)
    return measured[key]


def _fastest_passes(
    target, cache, shapes: list[tuple[int, int]], start: int, feature_layers: tuple[int, ...]
) -> list[tuple[tuple[int, int], float]]:
    """[((rows, tokens), the fastest of PROBE_ROUNDS passes of that shape after `start` positions)], in shape order;
    the rounds interleave the shapes, so a slow spell of the machine spreads over every one of them."""
    fastest = {shape: float("inf") for shape in shapes}
    for _ in range(PROBE_ROUNDS):
        for rows, n in shapes:
            fastest[rows, n] = min(fastest[rows, n], _timed_pass(target, cache, n, start, feature_layers, rows))
    return [(shape, fastest[shape]) for shape in shapes]


def _row_curves(
    target, cache, row_sizes: dict[int, tuple[int, ...]], feature_layers: tuple[int, ...], max_seq_len: int, per_key
) -> dict[int, list[tuple[int, float]]]:
    """{rows: [(tokens, seconds)]} of passes over several rows after CONTEXT_PROBE positions each, less the attention
    the model adds per (token, context key) (StepTimeModel.at_context). Why after a context: each row streams its own
    keys and values, which a one-row pass of as many tokens reads once. On this project's 2-core AVX2 EPYC, 8 rows of
    one token after 200 positions cost 2.4x the same pass after none, where one row of 8 tokens cost 1.2x: the part
    that grows with rows stays in these curves, timed at a context a served row typically has."""
    if not row_sizes:
        return {}
    deepest = max(-(-n // r) for r, sizes in row_sizes.items() for n in sizes)
    context = max(0, min(CONTEXT_PROBE, max_seq_len - deepest - 1))
    shapes = [(r, n) for r, sizes in sorted(row_sizes.items()) for n in sizes]
    curves: dict[int, list[tuple[int, float]]] = {}
    for (rows, n), t in _fastest_passes(target, cache, shapes, context, feature_layers):
        curves.setdefault(rows, []).append((n, max(t - per_key * n * context, 1e-6)))
    return curves


def _attention_per_key_query(
    target, cache, after_nothing: dict[int, float], feature_layers: tuple[int, ...], max_seq_len: int
) -> float:
    """Seconds of attention per (verified token, context key): a pass of n tokens after CONTEXT_PROBE positions against
    the same pass after none, timed back to back in pairs and the median pair's difference kept, at most what
    doubles the pass (StepTimeModel.at_context). 0 on a target whose rows run serially (its recorded curve is timed
    after a context already) or a cache too short to tell.

    Why pairs and a bound: the price is never corrected by the passes served (they are filed less it), so one slow
    spell must not set it for the worker's life. The fastest pass after a context less the fastest after none, taken
    at different moments, read 53 us a key on one start and 3.8 us on another in the same hour (a 2-core EPYC at
    load 4-6): at 53, every draft at 8 rows of 250 positions looked 100 ms dear. A pair shares its moment; a median
    drops a pair split by a burst."""
    n = max(k for k in after_nothing if k <= 8)
    context = min(CONTEXT_PROBE, max_seq_len - n - 1)
    if context < 64 or target.multi_token_rows_serial:
        return 0.0
    differences = []
    for _ in range(PROBE_ROUNDS):
        before = _timed_pass(target, cache, n, 0, feature_layers)
        differences.append(_timed_pass(target, cache, n, context, feature_layers) - before)
    difference = min(statistics.median(differences), after_nothing[n])
    return max(0.0, difference / (n * context))


def _timed_pass(target, cache, n: int, start: int, feature_layers: tuple[int, ...], rows: int = 1) -> float:
    """Seconds of one verify-shaped pass of n tokens in all over the cache's rows 0 .. rows - 1 at position `start`:
    n // rows tokens a row, one more in the first n % rows rows (a ragged pass: Target.ragged_rows)."""
    device = target.device
    per_row, extra = divmod(n, rows)
    width = per_row + (1 if extra else 0)
    tokens = torch.zeros(rows, width, dtype=torch.long, device=device)
    shape = {}
    if extra:
        lengths = [per_row + 1] * extra + [per_row] * (rows - extra)
        shape["row_lengths"] = torch.tensor(lengths, dtype=torch.long, device=device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = clock()
    target.forward(
        tokens,
        torch.full((rows,), start, dtype=torch.long, device=device),
        cache.rows(0, rows),
        feature_layers=feature_layers,
        logits="all",
        max_start=start,
        **shape,
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
    """The verify passes an engine served, by row count and token count: what corrects a probed or cached curve
    (module docstring).

    `add` takes a pass's seconds with its attention over the context already taken off (the curve's own
    per-key price), so passes at different context lengths measure the same t(rows, n)."""

    def __init__(self, window: int = SERVED_WINDOW):
        self.window = window
        self._passes: dict[tuple[int, int], deque[float]] = {}
        #: passes added since the last refit (`due`)
        self.num_new = 0

    def add(self, num_tokens: int, seconds: float, rows: int = 1) -> None:
        key = (int(rows), int(num_tokens))
        self._passes.setdefault(key, deque(maxlen=self.window)).append(max(seconds, 1e-6))
        self.num_new += 1

    def count(self, num_tokens: int, rows: int = 1) -> int:
        return len(self._passes.get((int(rows), int(num_tokens)), ()))

    def due(self) -> bool:
        """Whether enough passes came in since the last refit to refit the curve."""
        return self.num_new >= REFIT_EVERY

    def corrected(self, base: StepTimeModel) -> StepTimeModel:
        """`base` corrected by the served passes, row count by row count: per served (rows, size) the median of its
        passes with base's value there counted PROBE_WEIGHT times; each point of `base` no pass has measured, scaled
        by how the served sizes compare with base at its row count, or at the nearest row count served where its own
        was not (`_served_ratio`): a machine slower or faster than the probe saw is so at the neighbouring sizes too.
        A row count served that `base` has no curve for gets one: base's price there, so scaled, and its served
        points."""
        self.num_new = 0
        served = {
            key: statistics.median(list(passes) + [base.pass_seconds(*key)] * PROBE_WEIGHT)
            for key, passes in sorted(self._passes.items())
        }
        if not served:
            return base
        measured: dict[int, list[tuple[float, float, float]]] = {}  # rows -> [(drafts, base's seconds, served)]
        for (rows, n), t in served.items():
            measured.setdefault(rows, []).append((float(n - rows), base.pass_seconds(rows, n), t))

        def ratio(rows: int, n: int) -> float:
            nearest = min(measured, key=lambda r: (abs(r - rows), r))
            return _served_ratio(measured[nearest], n - rows, base.pass_seconds(nearest, nearest + n - rows))

        def curve(rows: int, sizes: list[int]) -> list[tuple[int, float]]:
            points = {n: base.pass_seconds(rows, n) * ratio(rows, n) for n in sizes}
            points.update({n: t for (r, n), t in served.items() if r == rows})
            return sorted(points.items())

        base_rows = base.row_points()
        pattern = [n - r for r, points in base_rows.items() for n, _ in points] or [int(n) - 1 for n in base.sizes]
        multi = {
            rows: curve(rows, [n for n, _ in base_rows[rows]] if rows in base_rows else [rows + e for e in pattern])
            for rows in sorted(set(base_rows) | {r for r, _ in served if r > 1})
        }
        return StepTimeModel(
            curve(1, [int(n) for n in base.sizes.tolist()]), base.rows_serial, base.per_key_query, multi
        )


#: the most a served curve's slope beyond its last two served sizes is taken to exceed base's there (`_served_ratio`)
MAX_SLOPE_RATIO = 4.0


def _served_ratio(points: list[tuple[float, float, float]], drafts: int, base_there: float) -> float:
    """served / base at `drafts` drafts beyond a token a row, from one row count's served points [(drafts, base's
    seconds, served seconds)] by increasing drafts (`base_there`: base's seconds at `drafts`). Within the served
    sizes, their ratios interpolated (the nearest one's below them); beyond the last two, the line through them in
    base's seconds: served there plus base's extra seconds times the served slope over base's (within 0 ..
    MAX_SLOPE_RATIO). Why not the last ratio: a probe that priced drafts too dear (a busy neighbour slowed every
    multi-token pass) overstates what each further draft costs by more than the ratio at the first drafted size
    says; a line through what was served recovers the truth where base's error grows with the drafts."""
    if len(points) == 1 or drafts <= points[-1][0]:
        xs, ys = [p[0] for p in points], [p[2] / p[1] for p in points]
        return ys[0] if len(xs) == 1 else _interpolate_float(min(max(drafts, xs[0]), xs[-1]), xs, ys)
    (_, b0, t0), (_, b1, t1) = points[-2], points[-1]
    slope = min(max((t1 - t0) / (b1 - b0), 0.0), MAX_SLOPE_RATIO) if b1 > b0 else t1 / b1
    return (t1 + (base_there - b1) * slope) / base_there


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
            #: 2: curves by row count as well (a file from before them is not read: the next start probes rows)
            "format": CACHE_FORMAT,
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
            rows = {
                int(r): sorted((int(n), float(ms) / 1e3) for n, ms in curve.items())
                for r, curve in record.get("rows_ms", {}).items()
            }
            return StepTimeModel(points, rows_serial, float(record.get("per_key_query_ns", 0.0)) / 1e9, rows)
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
            "rows_ms": {
                str(r): {str(n): round(t * 1e3, 4) for n, t in points} for r, points in model.row_points().items()
            },
        }
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(record, indent=1) + "\n")
            tmp.replace(self.path)
        except OSError as e:
            logger.warning("could not save the step curve to %s: %s", self.path, e)
