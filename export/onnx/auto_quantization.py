"""`--quantization auto`: one weight format for the whole run, the one this machine runs fastest.

Why per machine, and why one: the int8 graph (MatMulIntegerToFloat, per-row activations) keeps a multi-token verify
step nearly flat on CPUs with int8 dot products (VNNI, AMX) and the int4 graph (MatMulNBits) has the cheapest
single-token step elsewhere, so neither wins everywhere. Mixing them (int4 for one-token steps, int8 for verify
passes) would make the output a blend of two models, no longer what one target alone produces; so the export keeps
one.

Each candidate is exported whole (graph, verify graph, draft) into a staging folder inside the output and its
verify-step curve timed (exporter.record_step_curve); a neural draft's round is timed too, on that candidate's own
draft graphs (deepspec/decoding/draft_time.py, the engine's probe, at batch 1), since a draft runs on the same
kernels and costs several milliseconds a round that differ per format. Then every candidate decodes a few training
prompts as the worker would serve it, the candidates taking turns (decode_rate.py, which says why a measured rate
and not the model); the fastest moves up into the output and the others are deleted. Where no calibration prompts
are at hand (an installed package without datasets/) the modelled throughput decides instead: the draft's measured
acceptance length, its round cost added to each verify pass (deepspec/decoding/verify_budget.py,
modelled_tokens_per_second). onnx.json records the choice, every candidate's rate, modelled score, curve and draft
cost, and the τ each was scored with.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

#: the formats `auto` chooses among, in the order they are tried (a tie keeps the earlier)
AUTO_CANDIDATES = ("int8", "int4")
#: the staging folder inside the output (deleted before the export returns)
STAGING = ".candidates"


def export_fastest_format(
    target,
    draft,
    out_dir: str | Path,
    advance=lambda n=1: None,
    chat_template: str | None = None,
    candidates: tuple[str, ...] = AUTO_CANDIDATES,
) -> dict:
    """Export each candidate format, keep the fastest on this machine in out_dir; returns its meta (exporter's)
    with the `quantization_choice` record."""
    from deepspec.decoding.verify_budget import modelled_tokens_per_second
    from deepspec.models.step_curve import SCORED_DEPTH, curve_record, drafter_acceptance_length, recorded_curve
    from export.onnx.decode_rate import CALIBRATION_TOKENS, measure_decode_rates
    from export.onnx.exporter import export_onnx, resolve_draft_dir

    out = Path(out_dir)
    staging = out / STAGING
    draft_dir = resolve_draft_dir(draft, target)
    tau = drafter_acceptance_length(draft_dir, None if draft_dir else draft)
    metas, modelled, draft_rounds = {}, {}, {}
    try:
        for quant in candidates:
            (staging / quant).mkdir(parents=True)
            metas[quant] = export_onnx(target, draft, staging / quant, "float32", quant, advance, chat_template)
            curve = recorded_curve(metas[quant]["step_curve"])
            if curve is None:  # record_step_curve times several sizes; fewer means the measurement broke
                raise RuntimeError(f"the {quant} export's verify-step curve holds fewer than two timed sizes")
            draft_time = _draft_time(staging / quant, SCORED_DEPTH) if draft_dir is not None else None
            draft_rounds[quant] = None if draft_time is None else curve_record(draft_time.by_width())
            modelled[quant] = modelled_tokens_per_second(curve, tau, SCORED_DEPTH, draft_time)
        measured = measure_decode_rates({q: staging / q for q in candidates}, SCORED_DEPTH)
        scores = {q: measured[q]["tokens_per_second"] for q in candidates} if measured else modelled
        best = max(candidates, key=lambda q: scores[q])  # max keeps the first of equal scores
        for item in (staging / best).iterdir():
            shutil.move(str(item), out / item.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    meta = metas[best]
    rule = (
        f"highest tokens/s decoding {CALIBRATION_TOKENS} tokens of each calibration prompt (decode_rate.py: "
        f"training prompts, median, candidates in turn) at depth <= {SCORED_DEPTH}, as the worker serves it"
        if measured
        else f"highest modelled tokens/s at the best verify depth <= {SCORED_DEPTH} (verify_budget.py) on this "
        "machine's verify-step curves, a neural draft's round cost on each candidate added (no calibration "
        "prompts here to measure with)"
    )
    meta["quantization_choice"] = {
        "chosen": best,
        "rule": rule,
        # the draft's own eval τ, what the modelled scores assume; each candidate's measured τ may differ
        "acceptance_length": round(tau, 3),
        "depth": SCORED_DEPTH,
        # tokens_per_second: what the choice compared (measured, or modelled where nothing was measured);
        # draft_round: the candidate's batch-1 drafted round by width; null: priced as free (no draft, or lookup)
        "candidates": {
            q: {
                "tokens_per_second": round(scores[q], 1),
                "modelled_tokens_per_second": round(modelled[q], 1),
                "measured_acceptance_length": measured[q]["acceptance_length"] if measured else None,
                "step_curve": metas[q]["step_curve"],
                "draft_round": draft_rounds[q],
            }
            for q in candidates
        },
    }
    on_disk = json.loads((out / "onnx.json").read_text())
    on_disk["quantization_choice"] = meta["quantization_choice"]
    (out / "onnx.json").write_text(json.dumps(on_disk, indent=2) + "\n")
    return meta


def _draft_time(export_dir: Path, depth: int):
    """The batch-1 round cost of the draft an export holds, run as the worker serves that export (its draft graphs:
    the registry picks them for the export's own target), or None for a draft that runs no model."""
    from deepspec.decoding import build_drafter
    from deepspec.decoding.draft_time import measure_draft_time
    from deepspec.models import load_target

    target = load_target(str(export_dir))
    return measure_draft_time(target, build_drafter(str(export_dir / "draft"), target), depth)
