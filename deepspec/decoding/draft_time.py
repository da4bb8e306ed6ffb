"""What a drafted round costs the drafter, timed where it runs: the one probe behind every price put on drafting.

Two kinds of callers need it. The engine prices each round's drafting with it before the drafter runs
(planner.BudgetPlanner.draft_width: verify_budget.best_depth with the draft's seconds added), probing once at start for
one to all of its slots. The choices made before serving score a neural draft with it, at batch 1, on each candidate:
the worker's `--backend auto` (service/worker/fastest_backend.py) and the ONNX export's `--quantization auto`
(export/onnx/auto_quantization.py), where the draft runs on the candidate's own kernels (the ONNX draft graphs of that
format, or the PyTorch draft) and costs several milliseconds a round that differ per candidate. Both then price the
round the same way (verify_budget.DraftTimeModel), so a choice scores what the engine will do.

A drafter that runs no model of its own (`Drafter.costly_rows` not overridden: prompt or corpus lookup) is not
timed: it costs next to nothing beside a verify pass, and drafting is priced as free for it.
"""

from __future__ import annotations

import time
import weakref

import torch

from deepspec.decoding.draft_driver import DraftDriver
from deepspec.decoding.drafter import Drafter, DraftSampling, KVDrafter
from deepspec.decoding.verify_budget import DraftTimeModel

#: tokens a row commits in each probed round of the drafter: a drafted round's τ, about
PROBE_COMMIT_TOKENS = 2
#: the longest context a batch-1 probe outside an engine binds the drafter for (`measure_draft_time`)
PROBE_MAX_SEQ_LEN = 128
#: drafter -> {(target, rows, widths, feature layers): DraftTimeModel}: measured once per drafter, target and shape
#: in a process (an eval or a test suite builds many engines on one drafter)
_DRAFT_TIME_MODELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def runs_a_model(drafter: Drafter | None) -> bool:
    """Whether the drafter runs a model of its own for some rows (it overrides `Drafter.costly_rows`: the neural
    drafts, the hybrid): only such a drafter is timed and its rounds priced."""
    return drafter is not None and getattr(type(drafter), "costly_rows", Drafter.costly_rows) is not Drafter.costly_rows


def probe_draft_time(
    target, drafter: Drafter, rows: tuple[int, ...], widths: tuple[int, ...], max_seq_len: int
) -> DraftTimeModel:
    """Time a drafted round of `drafter` (bound to `target` for max(rows) slots or more and `max_seq_len` tokens):
    its propose and, for a KV drafter, its commit of the round's tokens (PROBE_COMMIT_TOKENS a row, about what a
    round commits), for every row count in `rows` and width in `widths`; the fastest of two runs each.

    The rounds run on a made-up sequence of random tokens in slots 0.. max(rows) - 1 (a corpus finds nothing to
    copy in it, a neural draft runs its full chain; a KV drafter is started on it with the features of one target
    pass over it, without a cache), through a batch state of the probe's own; every slot is released afterwards.
    Cached per drafter, target and shape in the process."""
    feature_layers = tuple(drafter.feature_layers)
    key = (id(target), tuple(rows), tuple(widths), feature_layers)
    measured = _DRAFT_TIME_MODELS.setdefault(drafter, {})
    if key not in measured:
        measured[key] = _time_rounds(target, drafter, tuple(rows), tuple(widths), max_seq_len, feature_layers)
    return measured[key]


def measure_draft_time(
    target, drafter: Drafter | None, depth: int, max_seq_len: int = PROBE_MAX_SEQ_LEN
) -> DraftTimeModel | None:
    """A drafter's batch-1 round cost on `target` at widths 1 and `depth`, what a choice between engines or weight
    formats scores a draft with (verify_budget.modelled_tokens_per_second); None where there is nothing to time
    (no drafter, or one that runs no model of its own: `runs_a_model`). Binds the drafter for one slot: build it for
    this probe, or bind it again before serving with it."""
    if drafter is None or not runs_a_model(drafter) or depth < 1:
        return None
    max_seq_len = min(max_seq_len, target.max_seq_len)
    drafter.bind(target, 1, max_seq_len)
    return probe_draft_time(target, drafter, (1,), tuple(sorted({1, depth})), max_seq_len)


def _time_rounds(
    target,
    drafter: Drafter,
    rows: tuple[int, ...],
    widths: tuple[int, ...],
    max_seq_len: int,
    feature_layers: tuple[int, ...],
) -> DraftTimeModel:
    device = target.device
    runs = 1 + 2 * len(rows) * len(widths)
    n = max(2, min(64, max_seq_len - max(widths) - 2 - runs * PROBE_COMMIT_TOKENS))
    tokens = torch.randint(target.vocab_size, (1, n), generator=torch.Generator().manual_seed(0))
    committed = tokens[0, :PROBE_COMMIT_TOKENS].tolist()
    driver = DraftDriver(drafter, num_slots=max(rows), max_tokens=max_seq_len + max(widths) + 2)
    kv = isinstance(drafter, KVDrafter)

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def run(num_rows: int, width: int) -> float:
        slots = list(range(num_rows))
        sampling = DraftSampling(torch.zeros(num_rows), [None] * num_rows, None)
        synchronize()
        t0 = time.perf_counter()
        proposal = driver.propose_ragged(slots, width, sampling)
        proposal.tokens.cpu()  # a draft on the device is done once its tokens are read back
        driver.commit(
            slots,
            [committed] * num_rows,
            None if features is None else features[:, :PROBE_COMMIT_TOKENS].expand(num_rows, -1, -1),
        )
        if kv:
            synchronize()
        return time.perf_counter() - t0

    with torch.inference_mode():
        features = None
        if kv and feature_layers:
            out = target.forward(
                tokens.to(device),
                torch.zeros(1, dtype=torch.long, device=device),
                None,
                feature_layers=feature_layers,
                logits="none",
            )
            features = out.features[:, : n - 1]
        for slot in range(max(rows)):
            driver.start(slot, tokens[0].tolist(), features)
        try:
            run(max(rows), max(widths))  # one-time setup stays out of the timings
            return DraftTimeModel({(r, w): min(run(r, w), run(r, w)) for r in rows for w in widths})
        finally:
            for slot in range(max(rows)):
                driver.release(slot)
