"""Throughput-aware verification budget: verify only as deep as the expected gain pays for the extra work.

Why: a verify pass scores every row at the same depth (rows are padded to the longest block), and on a CPU — or
a GPU at large batch — each extra position costs real time. A drafter that knows how likely each of its slots
is to survive (DSpark: the product of its calibrated confidences) lets the engine pick the depth d that
maximizes modelled throughput

    (rows + Σ_rows Σ_{j<d} survival[row, j]) / t(rows · (d + 1))

where t(n) is the step time of a verify pass over n tokens. A drafter that does not estimate survival (prompt
lookup) gets each sequence's own record instead (`observed_survival`), so speculation stops where it does not
pay. Token trees are budgeted the same way over nodes instead of depth (`best_nodes`): each row keeps its w
nodes of highest survival, which is ancestor-closed once survival never grows from parent to child. This is the
"hardware-aware verification budget" of the DSpark paper, which the reference implementation
(DeepSeek's DeepSpec repository, docs/ALGORITHMS.md) does not have.
Drafting has a price too. A neural draft runs forwards of its own each round it drafts (Eagle3 one per draft token,
DFlash and DSpark one per block) and then hears the committed tokens through another, so before it proposes, the
engine picks the width that pays on the sequences' acceptance records with the draft's time added to the verify
pass's (`DraftTimeModel`, `best_depth`'s `draft_seconds`): where even the best width loses to a target-only step the
round does not draft at all, so a draft too slow for what it gets accepted decodes at the target's own speed instead
of below it. The choices of an engine and a weight format before serving score candidates by the same rule at batch
1 (`modelled_tokens_per_second`, with the draft's round timed on each candidate by the engine's own probe:
deepspec/decoding/draft_time.py).
Where t(n) comes from (a probe, the passes served, a file per machine) is deepspec/decoding/step_timing.py; the
policy that applies these rules each round is deepspec/decoding/planner.py. t(n) interpolates its points
piecewise-linearly, not with one fitted line: with 4-bit weights a pass switches kernels at 8 rows
(packed_linear.Int4Weight), so t(n) has a knee.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from heapq import heapify, heappop, heappush
from typing import Protocol

import torch

from deepspec.decoding.tree import top_nodes


def _interpolate(x: torch.Tensor, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
    """ys over xs (sorted, two or more) joined piecewise-linearly at x: flat below xs[0], along the last segment's
    slope beyond xs[-1]."""
    last = len(xs) - 2
    segment = (torch.searchsorted(xs, x.clamp(min=xs[0]), right=True) - 1).clamp(0, last)
    x0, x1, y0, y1 = xs[segment], xs[segment + 1], ys[segment], ys[segment + 1]
    return y0 + (y1 - y0) * (x.clamp(min=xs[0]) - x0) / (x1 - x0)


def _interpolate_float(x: float, xs: list[float], ys: list[float]) -> float:
    """`_interpolate` for one point in plain Python floats: the same segments and arithmetic, none of torch's per-op
    cost (what the planner asks on the serving path)."""
    x = max(x, xs[0])
    segment = min(max(bisect_right(xs, x) - 1, 0), len(xs) - 2)
    x0, x1, y0, y1 = xs[segment], xs[segment + 1], ys[segment], ys[segment + 1]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


class StepTimeModel:
    """t(rows, n) seconds for a verify pass of `rows` rows over n tokens in all. One row's curve t(n) is the probe
    timings joined piecewise-linearly, made non-decreasing (a wider pass never costs less; a noisy probe must not
    make extra tokens look free), held flat below the first probe and extended along the last segment's slope beyond
    the last one. `rows` adds the same kind of curve for passes over several rows ({row count: [(total tokens,
    seconds)]}), keyed inside by the drafts a pass verifies beyond one token per row (n - rows), and joined linearly
    across row counts (`pass_seconds`).

    Why by rows: a pass of 8 rows is not a pass of one row with as many tokens. On the native decoder at context 200,
    8 rows of one token took 13.7 ms, and one more draft token +2.5 ms, where the one-row curve said t(8) = 9.2 and
    t(9) = 9.4 ms: priced by total tokens alone, extra drafts at 8 rows looked nearly free and the budget over-drafted
    (0.84x target-only at concurrency 8). A model without multi-row curves prices every pass by its total tokens."""

    def __init__(
        self,
        samples: list[tuple[int, float]],
        rows_serial: bool = False,
        per_key_query: float = 0.0,
        rows: dict[int, list[tuple[int, float]]] | None = None,
    ):
        #: the target runs a multi-token pass over several rows one row at a time (ONNX Runtime's attention after a
        #: past: deepspec/models/onnx_target.py), so B rows of d + 1 tokens cost B passes of d + 1, not one of B(d + 1)
        self.rows_serial = rows_serial
        #: seconds of attention per (verified token, context key) beyond what `samples` hold (`at_context`)
        self.per_key_query = float(per_key_query)
        fastest = _fastest(samples)
        if len(fastest) < 2:
            raise ValueError("a step-time model needs timings at two or more token counts")
        sizes = sorted(fastest)
        self.sizes = torch.tensor(sizes, dtype=torch.float64)
        self.times = torch.tensor([fastest[n] for n in sizes], dtype=torch.float64).clamp(min=1e-6).cummax(0).values
        self._size_list, self._time_list = self.sizes.tolist(), self.times.tolist()  # see `seconds`
        #: row count -> (drafts beyond one token per row, seconds), non-decreasing; row 1 is the one-row curve
        self._by_rows: dict[int, tuple[list[float], list[float]]] = {
            1: ([n - 1 for n in self._size_list], self._time_list)
        }
        for count, points in sorted((rows or {}).items()):
            self._by_rows[int(count)] = _row_curve(int(count), points)
        self._row_counts = sorted(self._by_rows)
        self._rounds: dict[tuple[int, int], torch.Tensor] = {}  # see rounds_upto
        self._round_lists: dict[tuple[int, int], list[float]] = {}  # see round_list

    @property
    def by_rows(self) -> bool:
        """Whether the model holds multi-row curves (else a pass is priced by its total tokens alone)."""
        return len(self._row_counts) > 1

    def row_points(self) -> dict[int, list[tuple[int, float]]]:
        """{row count >= 2: [(total tokens, seconds)]}: the multi-row curves as `rows` takes them (a cache file's)."""
        return {
            count: [(int(count + e), t) for e, t in zip(*self._by_rows[count])]
            for count in self._row_counts
            if count > 1
        }

    def pass_seconds(self, rows: int, num_tokens: int) -> float:
        """Seconds of one pass over `rows` rows holding num_tokens tokens in all (each row at least one): the curve of
        that row count at num_tokens - rows drafts, joined linearly between the row counts around it (along the
        last two beyond the largest, never below it); `seconds(num_tokens)` on a model without multi-row curves."""
        if not self.by_rows or rows <= 1:
            return self.seconds(num_tokens)
        drafts = float(max(num_tokens - rows, 0))
        counts = self._row_counts
        if rows in self._by_rows:
            return _curve_at(drafts, *self._by_rows[rows])
        above = min(bisect_right(counts, rows), len(counts) - 1)
        low, high = counts[above - 1], counts[above]
        t_low, t_high = _curve_at(drafts, *self._by_rows[low]), _curve_at(drafts, *self._by_rows[high])
        return max(t_low + (t_high - t_low) * (rows - low) / (high - low), t_high if rows > high else t_low)

    def predict(self, num_tokens):
        """Seconds for a pass over num_tokens (an int, or a tensor of counts)."""
        t = _interpolate(torch.as_tensor(num_tokens, dtype=torch.float64), self.sizes, self.times)
        return float(t) if t.dim() == 0 else t

    def seconds(self, num_tokens: int) -> float:
        """`predict` for one count, in plain Python floats."""
        return _interpolate_float(float(num_tokens), self._size_list, self._time_list)

    def round_seconds(self, rows: int, depths: torch.Tensor) -> torch.Tensor:
        """Seconds of a verify pass over `rows` rows each verifying d + 1 tokens, for every d in `depths`: one pass
        over rows * (d + 1) tokens (`pass_seconds` where the model has multi-row curves), or, on a target whose
        multi-token rows run serially, rows passes of d + 1 (a target-only step, d = 0, stays one batched pass)."""
        depths = torch.as_tensor(depths, dtype=torch.float64)
        if self.by_rows and rows > 1:
            seconds = [self.pass_seconds(rows, int(rows * (d + 1))) for d in depths.reshape(-1).tolist()]
            return torch.tensor(seconds, dtype=torch.float64).reshape(depths.shape)
        together = _interpolate(rows * (depths + 1), self.sizes, self.times)  # `predict`, kept a tensor
        if not self.rows_serial or rows == 1:
            return together
        return torch.where(depths > 0, rows * _interpolate(depths + 1, self.sizes, self.times), together)

    def rounds_upto(self, rows: int, depth: int) -> torch.Tensor:
        """round_seconds(rows, 0..depth), kept per (rows, depth): the budget asks it every round, and the model
        never changes once built (its interpolation was ~0.1 ms of a ~10 ms batch-1 round)."""
        key = (rows, depth)
        if key not in self._rounds:
            self._rounds[key] = self.round_seconds(rows, torch.arange(depth + 1))
        return self._rounds[key]

    def round_list(self, rows: int, depth: int) -> list[float]:
        """rounds_upto as Python floats, for the budget's arithmetic in plain Python (`_throughputs`)."""
        key = (rows, depth)
        if key not in self._round_lists:
            self._round_lists[key] = self.rounds_upto(rows, depth).tolist()
        return self._round_lists[key]

    def at_context(self, keys: int) -> RoundTimes:
        """This model for a round whose rows hold `keys` context positions between them: each verified token of a
        row attends that row's context, so a round of d + 1 tokens per row costs per_key_query * (d + 1) * keys more
        than the samples say. Why: the samples are passes after no context, and at 8 rows of ~250 positions each the
        attention they leave out was a third of a step on the native decoder, enough to make drafting at depth 1
        look as if it paid where it lost. The same model where per_key_query is 0 (a curve recorded after a
        context)."""
        return self if not self.per_key_query or not keys else _AtContext(self, keys)

    def __repr__(self) -> str:
        points = ", ".join(f"{int(n)}: {t * 1e3:.1f}" for n, t in zip(self.sizes.tolist(), self.times.tolist()))
        rows = "".join(
            f"; {count} rows: {{" + ", ".join(f"{n}: {t * 1e3:.1f}" for n, t in curve) + "}"
            for count, curve in self.row_points().items()
        )
        serial = ", rows serial" if self.rows_serial else ""
        context = f", {self.per_key_query * 1e9:.1f} ns per token and context key" if self.per_key_query else ""
        return f"StepTimeModel(ms by tokens {{{points}}}{rows}{serial}{context})"


def _fastest(samples) -> dict[int, float]:
    """{size: the fastest of its timings} (load only ever slows a pass)."""
    fastest: dict[int, float] = {}
    for n, t in samples:
        fastest[int(n)] = min(float(t), fastest.get(int(n), float("inf")))
    return fastest


def _row_curve(rows: int, points: list[tuple[int, float]]) -> tuple[list[float], list[float]]:
    """A multi-row curve: (drafts beyond one token per row, seconds) by increasing drafts, non-decreasing."""
    fastest = _fastest(points)
    if not fastest or min(fastest) < rows:
        raise ValueError(f"a {rows}-row curve needs timings at {rows} or more tokens, got {sorted(fastest)}")
    drafts, times, slowest = [], [], 1e-6
    for n in sorted(fastest):
        slowest = max(slowest, fastest[n])
        drafts.append(float(n - rows))
        times.append(slowest)
    return drafts, times


def _curve_at(x: float, xs: list[float], ys: list[float]) -> float:
    """`_interpolate_float`, and a curve of one point held flat."""
    return ys[0] if len(xs) == 1 else _interpolate_float(x, xs, ys)


class RoundTimes(Protocol):
    """What the budget prices a round with (`best_depth`, `best_nodes`): a StepTimeModel, or one at a context."""

    def round_seconds(self, rows: int, depths: torch.Tensor) -> torch.Tensor: ...

    def rounds_upto(self, rows: int, depth: int) -> torch.Tensor: ...

    def round_list(self, rows: int, depth: int) -> list[float]: ...


class _AtContext:
    """A StepTimeModel's round times with the attention over `keys` context positions added
    (StepTimeModel.at_context)."""

    def __init__(self, model: StepTimeModel, keys: int):
        self.model, self.keys = model, keys

    def round_seconds(self, rows: int, depths: torch.Tensor) -> torch.Tensor:
        depths = torch.as_tensor(depths, dtype=torch.float64)
        return self.model.round_seconds(rows, depths) + self.model.per_key_query * (depths + 1) * self.keys

    def rounds_upto(self, rows: int, depth: int) -> torch.Tensor:
        return torch.tensor(self.round_list(rows, depth), dtype=torch.float64)

    def round_list(self, rows: int, depth: int) -> list[float]:
        per_token = self.model.per_key_query * self.keys
        return [t + per_token * (d + 1) for d, t in enumerate(self.model.round_list(rows, depth))]


class DraftTimeModel:
    """s(rows, width): seconds a drafted round costs the drafter (its propose for `rows` rows of `width` drafts each,
    and a KV drafter's commit after it), from probes on a grid of (rows, width) (draft_time.probe_draft_time):
    linear in rows between the probed row counts (flat beyond them), then piecewise-linear in width like
    StepTimeModel, non-decreasing; 0 at width 0, where nothing is proposed. A single probed width (a draft of
    depth 1) prices every width alike."""

    def __init__(self, samples: dict[tuple[int, int], float]):
        self.rows = sorted({r for r, _ in samples})
        widths = sorted({w for _, w in samples})
        if not samples or any((r, w) not in samples for r in self.rows for w in widths):
            raise ValueError("a draft-time model needs a timing at every probed width for every probed row count")
        self.widths = torch.tensor(widths, dtype=torch.float64)
        self.times = torch.tensor([[samples[r, w] for w in widths] for r in self.rows], dtype=torch.float64)
        self.times = self.times.clamp(min=0).cummax(1).values.cummax(0).values  # more rows or drafts never cost less

    def round_seconds(self, rows: int, widths) -> torch.Tensor:
        """Seconds of one drafted round over `rows` rows for every width in `widths`."""
        widths = torch.as_tensor(widths, dtype=torch.float64)
        if len(self.rows) == 1:
            by_width = self.times[0]
        else:
            by_width = torch.stack(
                [
                    _interpolate(
                        torch.tensor(float(rows), dtype=torch.float64),
                        torch.tensor(self.rows, dtype=torch.float64),
                        self.times[:, j],
                    )
                    for j in range(len(self.widths))
                ]
            ).clamp(max=self.times[-1])
        at = by_width[0].expand_as(widths) if len(self.widths) == 1 else _interpolate(widths, self.widths, by_width)
        return torch.where(widths > 0, at, torch.zeros_like(widths))

    def by_width(self, rows: int = 1) -> dict[int, float]:
        """{width: seconds} of a round over `rows` rows at the probed widths: the batch-1 record an engine or
        weight-format choice keeps beside the verify-step curve it scored (fastest_backend.py, auto_quantization.py)."""
        return dict(zip((int(w) for w in self.widths.tolist()), self.round_seconds(rows, self.widths).tolist()))

    def __repr__(self) -> str:
        rows = "; ".join(
            f"{r} rows: " + ", ".join(f"{int(w)}: {t * 1e3:.2f}" for w, t in zip(self.widths.tolist(), ts))
            for r, ts in zip(self.rows, self.times.tolist())
        )
        return f"DraftTimeModel(ms by width {{{rows}}})"


def modelled_throughput(
    survival: torch.Tensor, model: RoundTimes, draft_seconds: torch.Tensor | None = None
) -> torch.Tensor:
    """survival [B, k] (P(slot j and all slots before it accepted); 0 where a row has no draft) → [k + 1] modelled
    tokens per second of a round verifying each depth 0..k: (B + Σ survival up to d) over the verify pass's
    seconds plus `draft_seconds` [k + 1], what drafting each depth costs (DraftTimeModel.round_seconds; 0 at depth
    0), when the drafts are yet to be made. The one pricing rule of the engine's budget and of the choices made by
    it (`best_depth`, `modelled_tokens_per_second`)."""
    return torch.tensor(_throughputs(survival, model, draft_seconds), dtype=torch.float64)


def best_depth(survival, model: RoundTimes, draft_seconds=None) -> int:
    """The verify depth 0..k with the highest `modelled_throughput` (same arguments, tensors or lists of floats);
    the first of equal ones."""
    throughputs = _throughputs(survival, model, draft_seconds)
    return throughputs.index(max(throughputs))


def best_row_depths(
    survival: list[list[float]], pass_seconds: Callable[[list[int]], float], weights: list[float] | None = None
) -> list[int]:
    """Each row's own verify depth, for a target that verifies ragged rows (Target.ragged_rows: a pass costs the
    tokens its rows hold, not B times the longest). survival [B][k] as `best_depth` reads it; `pass_seconds(depths)`
    prices a pass where row b verifies depths[b] drafts. Draft slots are taken best first across the batch (each
    row's next slot, by its survival, held non-increasing along the row so a row's slots come in order), and the
    depths kept are those of the highest modelled tokens per second, (B + Σ_b Σ_{j<d_b} survival[b][j]) /
    pass_seconds(depths): `best_depth`'s rule without the padding, so one row's confident draft is verified without
    every other row verifying as deep (vLLM's adaptive verification ranks draft slots across the batch alike). Ties
    keep the shallower depths. `weights` [B] (default all 1) values each row's tokens: a row of a latency-bound
    class weighs more, so under load its slots keep their place and a batch row's are dropped first."""
    weights = weights or [1.0] * len(survival)
    depths = [0] * len(survival)
    best, gain = list(depths), float(sum(weights))
    best_rate = gain / pass_seconds(depths)
    heap = [(-row[0] * w, b, 0) for b, (row, w) in enumerate(zip(survival, weights)) if row and row[0] > 0]
    heapify(heap)
    while heap:
        negative, b, j = heappop(heap)
        gain -= negative
        depths[b] = j + 1
        rate = gain / pass_seconds(depths)
        if rate > best_rate:
            best_rate, best = rate, list(depths)
        row = survival[b]
        if j + 1 < len(row) and row[j + 1] > 0:
            heappush(heap, (max(-row[j + 1] * weights[b], negative), b, j + 1))
    return best


def _throughputs(survival, model: RoundTimes, draft_seconds=None) -> list[float]:
    """modelled_throughput in plain Python floats over [B][k] survival (a tensor or lists): the budget prices every
    round, and each small torch op costs tens of microseconds after a forward has streamed the weights through the
    caches (~0.5 ms of a ~8 ms batch-1 round on the native decoder went to the budget's torch ops)."""
    rows = survival.tolist() if isinstance(survival, torch.Tensor) else survival
    B = len(rows)
    k = len(rows[0]) if B else (survival.shape[1] if isinstance(survival, torch.Tensor) else 0)
    seconds = model.round_list(B, k)
    if draft_seconds is not None:
        extra = draft_seconds.tolist() if isinstance(draft_seconds, torch.Tensor) else draft_seconds
        seconds = [t + e for t, e in zip(seconds, extra)]
    throughputs, gain = [B / seconds[0]], 0.0
    for j in range(k):
        column = 0.0
        for row in rows:
            column += row[j]
        gain += column
        throughputs.append((B + gain) / seconds[j + 1])
    return throughputs


def modelled_tokens_per_second(
    curve: dict[int, float], acceptance_length: float, depth: int, draft_time: DraftTimeModel | None = None
) -> float:
    """Batch-1 tokens per second on a verify-step curve ({T: seconds}) at the depth `best_depth` picks, for a
    draft whose rounds of `depth` drafts commit τ = `acceptance_length` tokens on average, each draft token
    accepted independently with the probability α that gives that τ (survival of slot j: α^(j+1)). Depth 0, a
    target-only step, is one of the choices, so a curve where drafting never pays scores 1 / t(1).

    `draft_time`: what a drafted round costs the draft itself (draft_time.measure_draft_time, at batch 1), added to
    each depth's verify pass as the engine adds it before a round drafts; None prices drafting as free (prompt or
    corpus lookup, ~0.4 ms a round). A neural draft costs several milliseconds a round, differently on each
    engine and weight format, so a curve whose cheap verify passes only pay at depth can lose to one with the
    cheaper single-token step once they are priced. What the worker and the ONNX export compare engines and weight
    formats by (deepspec/models/step_curve.py)."""
    model = StepTimeModel(sorted(curve.items()))
    alpha = _per_token_acceptance(acceptance_length, depth)
    survival = alpha ** torch.arange(1, max(depth, 0) + 1, dtype=torch.float64)[None, :]
    draft_seconds = None if draft_time is None else draft_time.round_seconds(1, torch.arange(max(depth, 0) + 1))
    return float(modelled_throughput(survival, model, draft_seconds).max())


def _per_token_acceptance(acceptance_length: float, depth: int) -> float:
    """α in [0, 1] with 1 + α + … + α^depth = τ (bisection; the sum grows with α), 0 for τ ≤ 1."""
    if acceptance_length <= 1.0 or depth < 1:
        return 0.0
    if acceptance_length >= depth + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid**j for j in range(depth + 1)) < acceptance_length:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def best_nodes(survival: torch.Tensor, model: RoundTimes) -> torch.Tensor:
    """The budget for token trees. survival [B, k] (P(node and all its ancestors accepted), non-increasing from
    parent to child, 0 past a row's nodes) → keep [B, k] bool: each row's w likeliest nodes (tree.top_nodes, the
    pruning every tree shares), w chosen like `best_depth` on the per-row sorted survival (a pass over B * (w + 1)
    tokens gains the sum of the kept survival). Ties go to the earlier node, so a child never precedes a parent
    of equal survival and the kept set is ancestor-closed: a tree over budget is cut, never refused. For a chain
    this is exactly `best_depth`."""
    ranked = survival.sort(dim=1, descending=True, stable=True).values
    return top_nodes(survival, survival > 0, best_depth(ranked, model))


#: prior rate at which a draft slot is accepted once reached, for a sequence with no record of it yet: optimistic,
#: so a new sequence drafts until its own record says drafting does not pay
PRIOR_SLOT_SURVIVAL = 0.7
#: the same for a sampled row: a deterministic draft is accepted only with the target's probability of it (the
#: corpus draft 17-20% of the time at temperature 1 on SmolLM2), so starting a sampled row at 0.7 made it draft
#: ~20 rounds before its record stopped it: at 8 streams and temperature 1 that served 0.92x of --draft none. At
#: 0.3 a sampled row drafts where extra verify tokens are nearly free (one row on a flat step curve) and waits for its
#: record where they are not.
PRIOR_SAMPLED_SLOT_SURVIVAL = 0.3
#: how many rounds of evidence the prior counts as
PRIOR_ROUNDS = 4.0


#: one sequence in this many starts from PRIOR_SLOT_SURVIVAL whatever the engine's history says (`AcceptanceHistory`),
#: so a history that stopped a draft keeps being re-measured and drafting comes back where the traffic changes
EXPLORE_EVERY = 8


#: drafts the calibration prior counts as (`EstimateCalibration`)
CALIBRATION_WEIGHT = 4.0


class EstimateCalibration:
    """How far a drafter's own survival estimates hold for one greedy sequence: the drafts it had accepted over the
    sum of the estimates of the drafts verified, shrunk toward a prior ratio with CALIBRATION_WEIGHT drafts of
    weight. The budget scales the drafter's estimates by it (`factor`), so a table measured elsewhere (corpus lookup's,
    on held-out answers of the fp32 target) is brought to this sequence's traffic while keeping its ranking of rounds:
    a long prompt-lookup match still drafts deeper than a one-token corpus match.

    Why a factor and not a cap by the sequence's record (as sampled rows have): capping greedy rows by their average
    record cut the deep drafts of good rounds (batch 1, native decoder: τ 2.34 -> 2.02 on gsm8k, -7% tok/s), and
    trusting the table as it was drafted rounds that lost at 8 rows (a verify token there costs ~6% of a pass:
    0.93x --draft none at concurrency 8)."""

    def __init__(self, prior: float = 1.0):
        self.prior = prior
        self.estimated = 0.0
        self.accepted = 0.0
        self._pending: float | None = None

    def factor(self, from_history: bool = True) -> float:
        """accepted over estimated, shrunk toward the prior ratio (from_history) or toward 1: a greedy row batched
        with a sampled one must not draft by what the engine served before, or the sampled row's draws would."""
        prior = self.prior if from_history else 1.0
        return (self.accepted + CALIBRATION_WEIGHT * prior) / (self.estimated + CALIBRATION_WEIGHT)

    def expect(self, estimate: float) -> None:
        """This round verifies drafts whose estimates sum to `estimate` (their expected accepted count)."""
        self._pending = estimate

    def settle(self, accepted: int) -> None:
        """The round's accepted drafts (a round without `expect` adds nothing)."""
        if self._pending is not None:
            self.estimated += self._pending
            self.accepted += accepted
            self._pending = None


class AcceptanceHistory:
    """The acceptance record of the greedy sequences an engine has finished: the prior a new greedy sequence's own
    record starts from (`observed_survival`'s `prior`), instead of the fixed optimistic PRIOR_SLOT_SURVIVAL. Why:
    with that prior every new sequence drafted ~10-20 rounds before its own record stopped a draft that does not pay
    (DSpark on the int4 ONNX target, τ 1.3: 0.92x target-only over 128 tokens); after the first sequences the
    engine knows. Each slot's history rate is itself shrunk to PRIOR_SLOT_SURVIVAL with PRIOR_ROUNDS rounds of
    weight, so a short history says little; one sequence in EXPLORE_EVERY ignores it. Sampled rows keep the fixed
    prior: which depths a sampled row drafts decides its draws, and a seeded request must sample the same tokens
    whatever the engine served before it."""

    def __init__(self):
        self._proposed: list[int] = []
        self._accepted: list[int] = []
        self._calibration = EstimateCalibration()

    def add(
        self, greedy: bool, proposed: list[int], accepted: list[int], calibration: EstimateCalibration | None = None
    ) -> None:
        """A finished sequence's record (proposed_per_position, accepted_per_position) and how its drafter's
        estimates held; a sampled one is not kept."""
        if not greedy:
            return
        for total, counts in ((self._proposed, proposed), (self._accepted, accepted)):
            total.extend([0] * (len(counts) - len(total)))
            for i, n in enumerate(counts):
                total[i] += n
        if calibration is not None:
            self._calibration.estimated += calibration.estimated
            self._calibration.accepted += calibration.accepted

    def calibration(self, sequence_id: int) -> EstimateCalibration:
        """A new greedy sequence's calibration, starting from the finished sequences' ratio (one in EXPLORE_EVERY
        from 1: the drafter's estimates as they are)."""
        return EstimateCalibration(1.0 if sequence_id % EXPLORE_EVERY == 0 else self._calibration.factor())

    def prior(self, greedy: bool, width: int, sequence_id: int, sampled: bool = False) -> list[float]:
        """[width] per-slot conditional acceptance rates a new sequence's record is shrunk toward: the history's for
        a greedy row among greedy rows (`greedy`), the fixed prior otherwise, the lower sampled one for a sampled
        row (`sampled`)."""
        fixed = [PRIOR_SAMPLED_SLOT_SURVIVAL if sampled else PRIOR_SLOT_SURVIVAL] * width
        if not greedy or sequence_id % EXPLORE_EVERY == 0:
            return fixed
        return _conditional_rates([(self._proposed, self._accepted)], width, [fixed])[0]


def observed_survival(records: list[tuple[list[int], list[int]]], width: int, prior=None) -> list[list[float]]:
    """Survival from each sequence's own record, for drafters that give none and for pricing a draft before it
    runs: per sequence, (proposed_per_position, accepted_per_position) — the rounds in which slot j was drafted and
    in which it was accepted — → [B, width] estimates of P(slot j and all before it accepted).

    The estimate is a product of per-slot conditional acceptance rates: slot j's accepted count over the rounds
    that reached it (slot j drafted and slot j - 1 accepted; at most the smaller of the two counts), each shrunk
    toward PRIOR_SLOT_SURVIVAL with PRIOR_ROUNDS rounds of weight. So a slot the record has never measured keeps
    decaying by the prior from the last measured one, instead of inheriting its estimate: a draft whose first
    slots are rarely accepted must not look worth drafting six deep (DSpark on the ONNX target drafted 6 slots a
    round at τ 1.45 that way, 0.75x target-only). Non-increasing in j, since every rate is at most 1.

    A sequence whose record drives the depth to 0 stops being measured. It then decodes target-only, which is what
    the record said pays. `prior`: [B][width] per-slot rates to shrink toward instead (AcceptanceHistory.prior; a
    tensor or lists). Lists of Python floats, as `best_depth` reads them: the budget asks every round, and after a
    target forward has streamed the weights through the caches each small torch op costs tens of microseconds."""
    if prior is None:
        prior = [[PRIOR_SLOT_SURVIVAL] * width for _ in records]
    out = []
    for rates in _conditional_rates(records, width, prior):
        survival, row = 1.0, []
        for rate in rates:
            survival *= rate
            row.append(survival)
        out.append(row)
    return out


def _conditional_rates(records: list[tuple[list[int], list[int]]], width: int, prior) -> list[list[float]]:
    """[B][width] P(slot j accepted | slot j reached) per record, each shrunk toward `prior` (module docstring of
    observed_survival)."""
    prior_rows = prior.tolist() if isinstance(prior, torch.Tensor) else prior
    rows = []
    for (p, a), shrink_to in zip(records, prior_rows):
        n = min(width, len(p))
        proposed = list(p[:n]) + [0] * (width - n)
        accepted = list(a[:n]) + [0] * (width - n)
        row = []
        for j in range(width):
            reached = proposed[0] if j == 0 else min(proposed[j], accepted[j - 1])
            row.append((accepted[j] + PRIOR_ROUNDS * shrink_to[j]) / (reached + PRIOR_ROUNDS))
        rows.append(row)
    return rows
