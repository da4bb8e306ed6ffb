"""Command-line values -> an `ExportJob`: open the target, pick the draft (`auto` = the best shipped draft this
format can take), settle the dtype, and run the format's own refusals, all before anything is written."""

from __future__ import annotations

from export.errors import ExportError
from export.job import DRAFT_KEYWORDS, ExportFormat, ExportJob
from export.sources import DraftSource, TargetSource, open_draft, open_target


def make_job(fmt: ExportFormat, args) -> ExportJob:
    dtype = args.dtype or fmt.dtypes[0]
    if dtype not in fmt.dtypes:
        raise ExportError(f"format {fmt.name} writes {', '.join(fmt.dtypes)}, not --dtype {dtype}")
    target = open_target(args.target)
    if target.family not in fmt.families:
        raise ExportError(f"format {fmt.name} cannot take a {target.family} target ({target.spec}): {fmt.engine} "
                          f"runs {', '.join(fmt.families)} targets here")
    job = ExportJob(target=target, draft_spec=args.draft, draft=None, dtype=dtype, tp=args.tp,
                    num_speculative_tokens=args.num_speculative_tokens, build=args.build)
    if args.draft == "auto":
        return _auto(fmt, job)
    if args.draft not in DRAFT_KEYWORDS:
        job.draft = open_draft(args.draft, target)
        if fmt.needs_neural_draft and not job.draft.is_neural:
            raise ExportError(f"format {fmt.name} needs a trained eagle3, dflash or dspark draft; {args.draft} is a "
                              f"{job.draft.algo} index, which only DeepSpec's worker runs (--format pytorch)")
    elif fmt.needs_neural_draft:
        raise ExportError(f"format {fmt.name} exports a trained draft; --draft {args.draft} leaves nothing to export "
                          "(pass a draft directory from python -m training)")
    if fmt.check is not None:
        fmt.check(job)
    return job


def _auto(fmt: ExportFormat, job: ExportJob) -> ExportJob:
    """The best-scoring shipped draft for the target that the format accepts (neural formats skip corpus indexes)."""
    from deepspec.models.drafts import best_shipped_draft, shipped_drafts

    if not fmt.needs_neural_draft and fmt.name in ("pytorch", "onnx"):  # formats the worker serves
        best = best_shipped_draft(job.target)  # the same choice the worker's --draft auto makes
        job.draft_spec = str(best) if best else "prompt-lookup"
        job.draft = open_draft(best, job.target) if best else None
        return job
    reasons = []
    for path, _score in sorted(shipped_drafts(job.target), key=lambda item: -item[1]):
        draft = open_draft(path, job.target)
        if not draft.is_neural:
            continue
        job.draft, job.draft_spec = draft, str(path)
        try:
            if fmt.check is not None:
                fmt.check(job)
            return job
        except ExportError as e:
            reasons.append(f"{path.name}: {e}")
    why = "; ".join(reasons) or "none is shipped"
    if not fmt.needs_neural_draft:  # the engine runs the target alone: degrade, loudly (the CLI prints it)
        job.draft, job.draft_spec = None, "none"
        job.options.setdefault("warnings", []).append(
            f"--draft auto: no shipped draft for {job.target.spec} fits format {fmt.name}; exporting the target "
            f"alone ({why})")
        if fmt.check is not None:
            fmt.check(job)
        return job
    raise ExportError(f"--draft auto: no shipped draft for {job.target.spec} fits format {fmt.name} ({why}); pass a "
                      "draft directory" + ("" if fmt.needs_neural_draft else ", or --draft none for the target alone"))


__all__ = ["make_job", "DraftSource", "TargetSource"]
