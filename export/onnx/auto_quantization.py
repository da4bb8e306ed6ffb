"""`--quantization auto`: one weight format for the whole run, the one this machine runs fastest.

Why per machine, and why one: the int8 graph (DynamicQuantizeMatMul) keeps a multi-token verify step nearly flat
on CPUs with int8 dot products (VNNI, AMX) and the int4 graph (MatMulNBits) has the cheapest single-token step
elsewhere, so neither wins everywhere. Mixing them (int4 for one-token steps, int8 for verify passes) would make
the output a blend of two models, no longer what one target alone produces; so the export keeps one.

Each candidate is exported whole (graph, verify graph, draft) into a staging folder inside the output and its
verify-step curve timed (exporter.record_step_curve); the one with the highest modelled throughput at the draft's
measured acceptance length (deepspec/decoding/verify_budget.py, modelled_tokens_per_second) moves up into the output, the others are deleted.
onnx.json records the choice, every candidate's curve and the τ it was scored with.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

#: the formats `auto` chooses among, in the order they are tried (a tie keeps the earlier)
AUTO_CANDIDATES = ("int8", "int4")
#: the staging folder inside the output (deleted before the export returns)
STAGING = ".candidates"


def export_fastest_format(target, draft, out_dir: str | Path, advance=lambda n=1: None,
                          chat_template: str | None = None, candidates: tuple[str, ...] = AUTO_CANDIDATES) -> dict:
    """Export each candidate format, keep the fastest on this machine in out_dir; returns its meta (exporter's)
    with the `quantization_choice` record."""
    from deepspec.decoding.verify_budget import modelled_tokens_per_second
    from deepspec.models.step_curve import SCORED_DEPTH, drafter_acceptance_length, recorded_curve
    from export.onnx.exporter import export_onnx, resolve_draft_dir

    out = Path(out_dir)
    staging = out / STAGING
    draft_dir = resolve_draft_dir(draft, target)
    tau = drafter_acceptance_length(draft_dir, None if draft_dir else draft)
    metas, scores = {}, {}
    try:
        for quant in candidates:
            (staging / quant).mkdir(parents=True)
            metas[quant] = export_onnx(target, draft, staging / quant, "float32", quant, advance, chat_template)
            curve = recorded_curve(metas[quant]["step_curve"])
            scores[quant] = modelled_tokens_per_second(curve, tau, SCORED_DEPTH)
        best = max(candidates, key=lambda q: scores[q])  # max keeps the first of equal scores
        for item in (staging / best).iterdir():
            shutil.move(str(item), out / item.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    meta = metas[best]
    meta["quantization_choice"] = {
        "chosen": best,
        "rule": f"highest modelled tokens/s at the best verify depth <= {SCORED_DEPTH} (verify_budget.py) on this "
                "machine's verify-step curves",
        "acceptance_length": round(tau, 3),
        "depth": SCORED_DEPTH,
        "candidates": {q: {"tokens_per_second": round(scores[q], 1), "step_curve": metas[q]["step_curve"]}
                       for q in candidates},
    }
    on_disk = json.loads((out / "onnx.json").read_text())
    on_disk["quantization_choice"] = meta["quantization_choice"]
    (out / "onnx.json").write_text(json.dumps(on_disk, indent=2) + "\n")
    return meta
