"""How deep each round verifies: the policy the engine asks before and after its drafter proposes.

`SpecEngine` owns admission, the round and the commit; a `RoundPlanner` decides, per round, how many drafts per row
to ask the drafter for (`draft_width`), how deep a proposed chain is verified (`chain_depth`) and which nodes of a
proposed tree (`keep_tree`). Two strategies:

- `RoundPlanner` itself verifies what the drafter proposes, within the engine's caps (vLLM's rule). It times
  nothing: the default of a `SpecEngine` built without a planner, and what evaluation uses to measure a draft's τ.
- `BudgetPlanner` is the throughput-aware verification budget (deepspec/decoding/verify_budget.py holds its
  arithmetic): it prices every depth with the step curve t(n) and the draft's own round cost, and verifies only as
  deep as pays. Its curve comes from deepspec/decoding/step_timing.py: a cache file per machine, else a robust
  probe, corrected online by the passes actually served (the file keeps a probe or a correction only where it was
  measured without busy neighbours, deepspec/neighbours.py) (greedy batches use the corrected curve; a batch with a
  sampled row keeps the curve the planner started with, so a seeded request samples the same tokens whatever the
  engine served before). A planner that finds drafting a loss keeps verifying a few rounds at other depths
  (EXPLORE_ROUNDS) so the served passes can show it was wrong.

The planner reads the batch's sequences duck-typed (`params`, `stats`, `calibration`, `cache_len`, `sequence_id`);
it never imports the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from deepspec.decoding.draft_time import probe_draft_time, runs_a_model
from deepspec.decoding.drafter import PaddedProposal
from deepspec.decoding.step_timing import (
    SAVE_EVERY,
    ServedSteps,
    StepCurveCache,
    probe_rows,
    probe_sizes,
    probe_step_curve,
    probe_verify_overhead,
    row_probe_sizes,
)
from deepspec.decoding.tree import keep_nodes, monotone_survival, top_nodes, tree_survival_from_record
from deepspec.decoding.verify_budget import (
    AcceptanceHistory,
    DraftTimeModel,
    StepTimeModel,
    best_depth,
    best_nodes,
    best_row_depths,
    observed_survival,
)
from deepspec.neighbours import NeighbourShare

#: rounds of greedy batches between two exploring rounds while some depth has too few served passes
EXPLORE_ROUNDS = 4
#: ... and once every candidate depth has MIN_SERVED passes (the window still rolls: the machine may change)
EXPLORE_ROUNDS_SETTLED = 128
#: exploring stops deepening at a depth whose verify pass costs this many target-only steps
EXPLORE_MAX_COST = 2.0
#: served passes per size before exploring it becomes rare
MIN_SERVED = 3
#: exploring may cost at most this share of the verify time served: what exploring passes took beyond the
#: target-only step the curve predicts for their rows. Depth 1 is always a candidate (the curve that says it is dear
#: may be the disturbed one), and at 8 rows on a compute-bound CPU it verifies twice the tokens of a step, or more:
#: unbounded, three exploring passes per start were most of what a concurrency-8 benchmark lost. Where exploring
#: is cheap (one row, a flat curve) the share still allows it every EXPLORE_ROUNDS rounds
EXPLORE_SHARE = 0.02


@dataclass(frozen=True)
class EngineShape:
    """What a planner needs of the engine it serves, handed over once (`RoundPlanner.bind`)."""

    target: Any
    drafter: Any
    max_batch_size: int
    max_seq_len: int
    num_speculative_tokens: int
    max_verify_tokens: int
    feature_layers: tuple[int, ...]
    #: the engine's KV cache: a probe times passes on its row 0 before any request runs
    cache: Any


class RoundPlanner:
    """Verify what the drafter proposes within the engine's caps; no timing, no history (module docstring)."""

    #: the verify-pass cost model the planner prices rounds with (None: it does not price them)
    step_time: StepTimeModel | None = None
    #: what a drafted round costs the drafter (None: free, or not priced)
    draft_time: DraftTimeModel | None = None

    def bind(self, shape: EngineShape) -> None:
        """Called once by the engine's constructor."""

    @property
    def times_passes(self) -> bool:
        """Whether the engine should time its verify passes for `observe_pass`."""
        return False

    def admit(self, seq) -> None:
        """A sequence joins the engine."""

    def finished(self, seq) -> None:
        """A sequence leaves the engine (finished or aborted)."""

    def forget_acceptance(self) -> None:
        """Forget what finished sequences accepted (after a warm-up request, which is not traffic)."""

    def start_round(self, rows: list) -> None:
        """A decode round over `rows` begins."""

    def draft_width(self, rows: list, caps: list[int], view) -> int:
        """Drafts per row to ask the drafter for (0: the round does not draft); `caps` [B] are the engine's limits."""
        return max(caps, default=0)

    def chain_depth(self, rows: list, proposal: PaddedProposal, counts: list[int]) -> int:
        """The depth the round verifies the proposed chains to; `counts` [B] are each row's capped draft counts."""
        return max(counts, default=0)

    def row_depths(self, rows: list, proposal: PaddedProposal, counts: list[int]) -> list[int]:
        """Each row's own verify depth, asked instead of `chain_depth` where the target verifies ragged rows
        (Target.ragged_rows); at most `counts`."""
        return list(counts)

    def keep_tree(self, rows: list, proposal: PaddedProposal) -> PaddedProposal:
        """The proposed trees (node counts already capped) with the nodes that are not worth verifying cut."""
        return proposal

    def observe_pass(self, row_tokens: list[int], row_keys: list[int], seconds: float) -> None:
        """A verify pass ran: row b scored row_tokens[b] tokens after row_keys[b] cached positions."""

    def round_done(self, rows: list, accepted: list[int]) -> None:
        """The round committed; `accepted` [B] drafts per row."""


class BudgetPlanner(RoundPlanner):
    """The throughput-aware verification budget (module docstring; the pricing rule is verify_budget.best_depth).

    `step_time`: a curve to start from instead of the cache or the probe (a test's, an export's recorded one).
    `price_drafting=False` prices drafting as free (every round asks the drafter; the budget cuts only its drafts).
    `curve_cache`: the file the curve is read from at bind and saved to as served passes correct it (None: no file;
    `StepCurveCache.for_target` gives a target's default one). `learn_online=False` keeps the starting curve."""

    def __init__(
        self,
        step_time: StepTimeModel | None = None,
        *,
        price_drafting: bool = True,
        curve_cache: StepCurveCache | None = None,
        learn_online: bool = True,
        per_row_depths: bool = False,
    ):
        self._given = step_time
        #: on a target with ragged rows, rank draft slots across the batch and give each row its own depth (and tree
        #: size), priced on the step model by rows (StepTimeModel.pass_seconds). Off by default: ranked on the one-row
        #: curve they over-drafted (chat 0.84x of target-only against 0.89x padded); priced by rows, ranked, uniform
        #: and padded depths all verify 1.00-1.04 tokens a row and pass at 8 rows on chat and lbpp, and their tok/s
        #: differ by less than the noise (bench.ragged_verify on a 2-core AVX2 EPYC at load 4-6: chat 1.11x / 1.05x /
        #: 1.07x of target-only, lbpp 0.95x / 1.03x / 1.05x, where an engine that drafted nothing read 1.06x and 0.95x).
        #: Off, one depth serves the batch as on a padded target and only rows whose drafts are shorter pass fewer
        #: tokens
        self.per_row_depths = per_row_depths
        self.price_drafting = price_drafting
        self.curve_cache = curve_cache
        self.learn_online = learn_online
        self._step_time: StepTimeModel | None = None
        #: the curve a batch with a sampled row is priced with: the one the planner started with
        self._start_curve: StepTimeModel | None = None
        self.draft_time: DraftTimeModel | None = None
        #: greedy (False) / sampled (True) -> seconds the acceptance op adds to a drafted round (None: not probed)
        self.verify_overhead: dict[bool, float] | None = None
        #: the finished sequences' acceptance, the prior a new sequence's own record starts from
        self.acceptance_history = AcceptanceHistory()
        self.served = ServedSteps()
        self._shape: EngineShape | None = None
        #: the target verifies ragged rows (bound from the engine's target)
        self._ragged = False
        self._online = False
        self._refits = 0
        #: other processes' CPU share since the curve was last kept (bind, observe_pass)
        self._neighbours: NeighbourShare | None = None
        self._rounds = 0
        #: width -> this round's observed survival (`_observed_survival`)
        self._round_survival: dict[int, list[list[float]]] = {}
        #: the depth this round explores, where it does (`_exploring`)
        self._explore: int | None = None
        #: seconds of verify passes served, and what exploring passes took beyond a target-only step (EXPLORE_SHARE)
        self._served_seconds = 0.0
        self._explore_seconds = 0.0

    @property
    def step_time(self) -> StepTimeModel | None:
        return self._step_time

    @step_time.setter
    def step_time(self, model: StepTimeModel | None) -> None:
        """A curve set by hand is used as it is, by every batch, and not corrected."""
        self._step_time = self._start_curve = model
        self._online = False

    def bind(self, shape: EngineShape) -> None:
        self._shape = shape
        self._ragged = shape.target.ragged_rows
        if shape.drafter is None or not shape.num_speculative_tokens:
            return
        target = shape.target
        curve = self._given or self._recorded(target)
        if curve is None and self.curve_cache is not None:
            curve = self.curve_cache.load(target.multi_token_rows_serial)
        if curve is None:
            rows = probe_rows(shape.max_batch_size, shape.max_verify_tokens, target.multi_token_rows_serial)
            row_sizes = {
                r: row_probe_sizes(r, shape.max_verify_tokens, shape.num_speculative_tokens, self._ragged) for r in rows
            }
            with NeighbourShare() as neighbours:
                curve = probe_step_curve(
                    target,
                    shape.cache,
                    probe_sizes(shape.max_verify_tokens, shape.max_seq_len),
                    shape.feature_layers,
                    shape.max_seq_len,
                    row_sizes,
                )
            if self.curve_cache is not None and not neighbours.busy:  # a disturbed probe serves this start only
                self.curve_cache.save(curve)
        self._step_time = self._start_curve = curve
        self._online = self.learn_online and self._given is None and target.device.type == "cpu"
        self._neighbours = NeighbourShare().start()  # the passes until the next save: kept only if quiet
        self.verify_overhead = probe_verify_overhead(target, shape.num_speculative_tokens)
        if self.price_drafting and runs_a_model(shape.drafter):
            self.draft_time = probe_draft_time(
                target,
                shape.drafter,
                tuple(sorted({1, shape.max_batch_size})),
                tuple(sorted({1, shape.num_speculative_tokens})),
                shape.max_seq_len,
            )

    @classmethod
    def kept_per_machine(cls, target, drafter) -> BudgetPlanner:
        """The budget a server runs with: its curve kept per target, captured layers and machine in the cache
        directory, so each start (the engine choice's calibration decode included) begins from what the last one
        served (step_timing.StepCurveCache)."""
        layers = tuple(drafter.feature_layers) if drafter is not None else ()
        return cls(curve_cache=StepCurveCache.for_target(target, layers))

    @staticmethod
    def _recorded(target) -> StepTimeModel | None:
        """The target's own recorded verify-step curve on this machine (an ONNX export times it once), or None."""
        recorded = target.recorded_step_curve()
        return StepTimeModel(sorted(recorded.items()), target.multi_token_rows_serial) if recorded else None

    @property
    def times_passes(self) -> bool:
        return self._online

    # ---- sequences -------------------------------------------------------------------------------------------
    def admit(self, seq) -> None:
        if seq.params.greedy:  # a sampled row's depths decide its draws: they must not follow the engine's history
            seq.calibration = self.acceptance_history.calibration(seq.sequence_id)

    def finished(self, seq) -> None:
        self.acceptance_history.add(
            seq.params.greedy, seq.stats.proposed_per_position, seq.stats.accepted_per_position, seq.calibration
        )

    def forget_acceptance(self) -> None:
        self.acceptance_history = AcceptanceHistory()

    def round_done(self, rows: list, accepted: list[int]) -> None:
        for seq, n in zip(rows, accepted):
            seq.calibration.settle(n)

    # ---- rounds ----------------------------------------------------------------------------------------------
    def start_round(self, rows: list) -> None:
        self._round_survival = {}  # the batch and its records as this round finds them
        self._explore = self._exploring(rows)

    def draft_width(self, rows: list, caps: list[int], view) -> int:
        """The width the budget pays for (a costly drafter priced before it runs: `_costly_width`); a cheap chain
        drafter is skipped where no depth pays on the rows' records, a tree drafter where none would pay even if
        every node were accepted (its nodes are then kept on their own estimates). An exploring round asks for at
        least the depth it explores."""
        width = max(caps)
        if self._step_time is None:
            return width
        if self._explore is not None:
            return min(width, max(self._explore, 1)) if self._explore else 0
        drafter, draft_time = self._bound_shape().drafter, self.draft_time
        costly = drafter.costly_rows(view, list(range(len(caps)))) if drafter is not None and draft_time else 0
        tree = getattr(drafter, "tree", None)
        if not costly and tree:
            return width if best_depth([[1.0] * width] * len(caps), self._model(rows)) > 0 else 0
        survival = _live(self._observed_survival(rows, width), caps)
        if not costly or draft_time is None:
            if self._ranks_rows:
                return width if any(best_row_depths(survival, self._ragged_seconds(rows), _class_weights(rows))) else 0
            return width if best_depth(survival, self._model(rows)) > 0 else 0
        depth = best_depth(survival, self._model(rows), draft_time.round_seconds(costly, torch.arange(width + 1)))
        return width if depth and tree else depth

    def chain_depth(self, rows: list, proposal: PaddedProposal, counts: list[int]) -> int:
        """The depth the budget pays for on the proposal's own survival estimates or, where it has none, on each
        sequence's acceptance record (`_chain_survival`), one depth for the whole padded batch."""
        if self._step_time is None:
            return max(counts, default=0)
        if self._explore is not None:
            return self._explore
        survival, estimates = self._chain_survival(rows, proposal, counts)
        depth = best_depth(survival, self._model(rows), self._verify_extra(rows, proposal.tokens.shape[1]))
        self._expect(rows, estimates, [depth] * len(rows))
        return depth

    def row_depths(self, rows: list, proposal: PaddedProposal, counts: list[int]) -> list[int]:
        """Each row's depth on a target that verifies ragged rows. With per_row_depths, its own: the same survival as
        `chain_depth`, slots ranked across the batch (verify_budget.best_row_depths) and priced as the pass they make,
        Σ (d_b + 1) tokens; else `chain_depth`'s one depth, each row cut to its own draft count."""
        if self._step_time is None:
            return list(counts)
        if self._explore is not None:
            return [min(n, self._explore) for n in counts]
        if not self.per_row_depths:
            depth = self.chain_depth(rows, proposal, counts)
            return [min(n, depth) for n in counts]
        survival, estimates = self._chain_survival(rows, proposal, counts)
        depths = best_row_depths(survival, self._ragged_seconds(rows), _class_weights(rows))
        self._expect(rows, estimates, depths)
        return depths

    @property
    def _ranks_rows(self) -> bool:
        """Whether rows get their own depths: asked for (per_row_depths) and the target verifies ragged rows."""
        return self.per_row_depths and self._ragged

    def _chain_survival(
        self, rows: list, proposal: PaddedProposal, counts: list[int]
    ) -> tuple[list[list[float]], list[list[float]] | None]:
        """([B][width] survival the round's depths are priced on, the drafter's own estimates or None).

        A greedy row's estimates are scaled by how far they have held for it (verify_budget.EstimateCalibration),
        and in a batch of several rows also capped by its record: at 8 rows an extra verify token costs ~6% of a
        pass. A deterministic draft (no q: corpus lookup's tables) is accepted by a sampled row only with the
        target's probability of it, so a sampled row's estimate is capped by its own record: once drafting stops
        paying for it, it stops drafting."""
        width = proposal.tokens.shape[1]
        sampled = [not s.params.greedy for s in rows]
        estimates = None if proposal.survival is None else _live(proposal.survival.tolist(), counts)
        if estimates is None:
            return _live(self._observed_survival(rows, width), counts), None
        all_greedy = not any(sampled)
        survival = [
            [min(v * factor, 1.0) for v in row]
            for row, factor in zip(estimates, (s.calibration.factor(all_greedy) for s in rows))
        ]
        if proposal.probs is None and (len(rows) > 1 or any(sampled)):
            survival = [
                [min(e if is_sampled else v, o) for e, v, o in zip(estimated, calibrated, observed)]
                for estimated, calibrated, observed, is_sampled in zip(
                    estimates, survival, self._observed_survival(rows, width), sampled
                )
            ]
        return survival, estimates

    def _verify_extra(self, rows: list, width: int) -> list[float] | None:
        """[width + 1] seconds the acceptance op adds to a round verifying each depth (a target-only round pays its
        short path, which all rounds share), or None where it was not probed."""
        if self.verify_overhead is None:
            return None
        return [0.0] + [self.verify_overhead[any(not s.params.greedy for s in rows)]] * width

    def _ragged_seconds(self, rows: list):
        """depths [B] -> seconds of a ragged verify pass: the curve at B rows and Σ (d_b + 1) tokens
        (StepTimeModel.pass_seconds), each row's attention over
        its own context (StepTimeModel.per_key_query), and the acceptance op where any row drafts."""
        model = self._curve(rows)
        keys = [s.cache_len for s in rows]
        extra = self._verify_extra(rows, 1)
        drafted = extra[1] if extra is not None else 0.0

        def seconds(depths: list[int]) -> float:
            tokens = sum(depths) + len(depths)
            attention = model.per_key_query * sum((d + 1) * k for d, k in zip(depths, keys))
            return model.pass_seconds(len(depths), tokens) + attention + (drafted if any(depths) else 0.0)

        return seconds

    def _expect(self, rows: list, estimates: list[list[float]] | None, depths: list[int]) -> None:
        """Tell each greedy row's calibration what its drafts at `depths` are expected to win."""
        if estimates is None:
            return
        for seq, row, depth in zip(rows, estimates, depths):
            if depth and seq.params.greedy:
                seq.calibration.expect(sum(row[:depth]))

    def keep_tree(self, rows: list, proposal: PaddedProposal) -> PaddedProposal:
        """Each row's top-w nodes by survival, w the width whose B * (w + 1) verify tokens pay best
        (verify_budget.best_nodes) or, on a target with ragged rows, each row's own w from its nodes ranked across
        the batch (verify_budget.best_row_depths over each row's sorted survival); ancestor-closed because survival
        is made non-increasing along paths first."""
        if self._step_time is None:
            return proposal
        parents, num = proposal.tree_parents(), proposal.num_tokens
        k = proposal.tokens.shape[1]
        survival = proposal.survival
        if survival is None:
            survival = tree_survival_from_record(
                torch.tensor(self._observed_survival(rows, max(k, 1)), dtype=torch.float64).reshape(
                    len(rows), max(k, 1)
                ),
                parents,
                num,
            )
        survival = monotone_survival(survival, parents, num)
        if self._ranks_rows:
            ranked = survival.sort(dim=1, descending=True, stable=True).values.tolist()
            widths = torch.tensor(best_row_depths(ranked, self._ragged_seconds(rows), _class_weights(rows)))[:, None]
            keep = top_nodes(survival, survival > 0, widths)
        else:
            keep = best_nodes(survival, self._model(rows))
        return keep_nodes(proposal, keep & (torch.arange(k)[None, :] < num[:, None]))

    def observe_pass(self, row_tokens: list[int], row_keys: list[int], seconds: float) -> None:
        """Learn from a served pass (step_timing.ServedSteps): its seconds less the modelled attention, at its size."""
        if not self._online:
            return
        step_time, start_curve = self._curves()
        num_rows, tokens = len(row_tokens), sum(row_tokens)
        self._served_seconds += seconds
        if self._explore:
            target_only = step_time.pass_seconds(num_rows, num_rows) + start_curve.per_key_query * sum(row_keys)
            self._explore_seconds += max(0.0, seconds - target_only)
        seconds -= start_curve.per_key_query * sum(n * k for n, k in zip(row_tokens, row_keys))
        if start_curve.rows_serial and num_rows > 1 and max(row_tokens) > 1:
            self.served.add(max(row_tokens), seconds / num_rows)
        else:
            self.served.add(tokens, seconds, num_rows)
        if self.served.due():
            self._step_time = corrected = self.served.corrected(start_curve)
            self._refits += 1
            if self.curve_cache is not None and self._refits % SAVE_EVERY == 0:
                neighbours = self._neighbours
                assert neighbours is not None  # started by bind, as _online is
                neighbours.stop()
                if not neighbours.busy:  # passes served beside busy neighbours correct this run only
                    self.curve_cache.save(corrected)
                self._neighbours = NeighbourShare().start()

    # ---- helpers ---------------------------------------------------------------------------------------------
    def _bound_shape(self) -> EngineShape:
        """The engine's shape, which `bind` gave; a round before it is a caller's bug."""
        if self._shape is None:
            raise RuntimeError("BudgetPlanner used before SpecEngine bound it (bind)")
        return self._shape

    def _curves(self) -> tuple[StepTimeModel, StepTimeModel]:
        """(the corrected curve, the starting one): only asked for once there is a curve (bind or step_time set
        one, and both are set together)."""
        if self._step_time is None or self._start_curve is None:
            raise RuntimeError("BudgetPlanner has no step-time curve yet (bind, or set step_time)")
        return self._step_time, self._start_curve

    def _curve(self, rows: list) -> StepTimeModel:
        """The step curve for this round: the corrected one for a greedy batch, the starting one where a row
        samples."""
        step_time, start_curve = self._curves()
        return step_time if all(s.params.greedy for s in rows) else start_curve

    def _model(self, rows: list):
        """The step-time model for this round (`_curve`) with the rows' context added (StepTimeModel.at_context)."""
        return self._curve(rows).at_context(sum(s.cache_len for s in rows))

    def _exploring(self, rows: list) -> int | None:
        """The depth this round verifies whatever the budget says, or None: every EXPLORE_ROUNDS rounds of a greedy
        batch (EXPLORE_ROUNDS_SETTLED once every candidate has MIN_SERVED passes), the candidate depth whose pass
        size the served passes have measured least (ties: the shallower). Candidates grow one depth at a time:
        0 .. one past the deepest depth measured MIN_SERVED times, and not past a depth whose pass already costs
        EXPLORE_MAX_COST target-only steps, so exploring never verifies a block far dearer than a step; and none while
        what exploring cost is over EXPLORE_SHARE of the time served."""
        if not self._online or not rows or not all(s.params.greedy for s in rows):
            return None
        self._rounds += 1
        if self._rounds % EXPLORE_ROUNDS:  # every exploring round is one (EXPLORE_ROUNDS divides the settled period)
            return None
        if self._explore_seconds > EXPLORE_SHARE * self._served_seconds:
            return None
        step_time = self._curves()[0]
        size = [self._pass_size(len(rows), d) for d in range(self._bound_shape().num_speculative_tokens + 1)]
        served = [self.served.count(n, num_rows) for num_rows, n in size]
        top = 1
        while (
            top < len(size) - 1
            and served[top] >= MIN_SERVED
            and step_time.pass_seconds(*size[top]) < EXPLORE_MAX_COST * step_time.pass_seconds(*size[0])
        ):
            top += 1
        depths = range(min(top, len(size) - 1) + 1)
        counts = {d: served[d] for d in depths}
        least = min(depths, key=lambda d: (counts[d], d))
        every = EXPLORE_ROUNDS if counts[least] < MIN_SERVED else EXPLORE_ROUNDS_SETTLED
        return least if self._rounds % every == 0 else None

    def _pass_size(self, num_rows: int, depth: int) -> tuple[int, int]:
        """(rows, tokens) `ServedSteps` files a pass of `num_rows` rows verifying `depth` drafts each under."""
        if self._curves()[1].rows_serial and num_rows > 1 and depth > 0:
            return 1, depth + 1
        return num_rows, num_rows * (depth + 1)

    def _observed_survival(self, rows: list, width: int) -> list[list[float]]:
        """[B][width] survival from the batch's own acceptance records, each shrunk toward the prior the finished
        greedy sequences give (sampled rows: the fixed prior; verify_budget.AcceptanceHistory). In a batch with a
        sampled row every row takes the fixed prior: the round's depth is the batch's, so a greedy co-runner's
        history-fed estimate would change the sampled row's draws. Computed once a round per width."""
        if width not in self._round_survival:
            records = [(s.stats.proposed_per_position, s.stats.accepted_per_position) for s in rows]
            all_greedy = all(s.params.greedy for s in rows)
            prior = [
                self.acceptance_history.prior(
                    s.params.greedy and all_greedy, width, s.sequence_id, sampled=not s.params.greedy
                )
                for s in rows
            ]
            self._round_survival[width] = observed_survival(records, width, prior)
        return self._round_survival[width]


def _class_weights(rows: list) -> list[float] | None:
    """What each row's tokens are worth to the ragged budget: halved per step of priority below the batch's most
    urgent (SamplingParams.priority, a service class's place), so under load a batch row's drafts are dropped before an
    interactive row's; None where every row has one priority (then the weights change nothing)."""
    priorities = [s.params.priority for s in rows]
    top = min(priorities, default=0)
    return None if all(p == top for p in priorities) else [0.5 ** (p - top) for p in priorities]


def _live(rows: list[list[float]], counts: list[int]) -> list[list[float]]:
    """[B][width] per-slot values with each row's slots past its count set to 0 (no draft, nothing to survive)."""
    return [[v if j < n else 0.0 for j, v in enumerate(row)] for row, n in zip(rows, counts)]
