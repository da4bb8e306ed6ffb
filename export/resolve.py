"""Command-line values -> an `ExportJob`: open the target, pick the draft (`auto` = the best shipped draft this
format can take), settle the dtype, and run the format's own refusals, all before anything is written.

`--draft auto` walks the shipped drafts for the target best first (mean greedy acceptance length in eval.json) and
takes the first one the format accepts, so every format exports from the default command: the worker's formats
rank them as the worker's own `--draft auto` does and fall back to prompt lookup; an engine that runs the target
alone (TensorRT-LLM, Triton) falls back to that with a warning; a draft-only format (vLLM, SGLang) stops, naming
each shipped draft and why the engine cannot load it.
"""

from __future__ import annotations

from export.errors import ExportError
from export.job import ExportFormat, ExportJob
from export.sources import DraftSource, TargetSource, open_draft, open_target


def make_job(fmt: ExportFormat, args) -> ExportJob:
    dtype = args.dtype or fmt.dtypes[0]
    if dtype not in fmt.dtypes:
        raise ExportError(f"format {fmt.name} writes {', '.join(fmt.dtypes)}, not --dtype {dtype}")
    target = open_target(args.target)
    if target.family not in fmt.families:
        raise ExportError(
            f"format {fmt.name} cannot take a {target.family} target ({target.spec}): {fmt.runtime} "
            f"runs {', '.join(fmt.families)} targets here"
        )
    job = ExportJob(
        target=target,
        draft_spec=args.draft,
        draft=None,
        dtype=dtype,
        tp=args.tp,
        num_speculative_tokens=args.num_speculative_tokens,
        build=args.build,
    )
    from deepspec.decoding.registry import drafter_keywords

    if args.draft == "auto":
        return _auto(fmt, job)
    if args.draft not in drafter_keywords():
        job.draft = open_draft(args.draft, target)
    elif fmt.needs_neural_draft:
        raise ExportError(
            f"format {fmt.name} exports a trained draft; --draft {args.draft} leaves nothing to export "
            "(pass a draft directory from python -m training)"
        )
    _check(fmt, job)
    return job


def _check(fmt: ExportFormat, job: ExportJob) -> None:
    """Every refusal of `fmt` for this job's draft (ExportError naming the engine and the reason)."""
    if job.draft is not None and fmt.needs_neural_draft and not job.draft.is_neural:
        from deepspec.algorithms import available_algorithms

        raise ExportError(
            f"format {fmt.name} needs a trained draft ({', '.join(available_algorithms())}); "
            f"{job.draft.path.name} is {job.draft.kind}, which only DeepSpec's worker runs "
            "(--format pytorch)"
        )
    if fmt.check is not None:
        fmt.check(job)


def _ranked(fmt: ExportFormat, target: TargetSource) -> list:
    from deepspec.models.drafts import ranked_shipped_drafts, shipped_drafts

    if fmt.serves_in_worker:  # the same order the worker's --draft auto picks from
        return ranked_shipped_drafts(target)
    return [path for path, _ in sorted(shipped_drafts(target), key=lambda item: -item[1])]


def _auto(fmt: ExportFormat, job: ExportJob) -> ExportJob:
    """The best-scoring shipped draft for the target that the format accepts."""
    reasons = []
    for path in _ranked(fmt, job.target):
        try:
            job.draft, job.draft_spec = open_draft(path, job.target), str(path)
            _check(fmt, job)
            return job
        except ExportError as e:
            reasons.append(f"{path.name}: {e}")
    job.draft = None
    why = "; ".join(reasons) or "none is shipped"
    if fmt.serves_in_worker:  # what the worker's --draft auto runs when no shipped draft qualifies
        job.draft_spec = "prompt-lookup"
    elif not fmt.needs_neural_draft:  # the engine runs the target alone: degrade, loudly (the CLI prints it)
        job.draft_spec = "none"
        job.options.setdefault("warnings", []).append(
            f"--draft auto: no shipped draft for {job.target.spec} fits format {fmt.name}; exporting the target "
            f"alone ({why})"
        )
    else:
        raise ExportError(
            f"--draft auto: no shipped draft for {job.target.spec} fits format {fmt.name} ({why}); "
            "pass a draft directory"
        )
    if reasons and fmt.serves_in_worker:
        job.options.setdefault("warnings", []).append(
            f"--draft auto: no shipped draft for {job.target.spec} fits format {fmt.name}; exporting prompt lookup "
            f"({why})"
        )
    _check(fmt, job)
    return job


__all__ = ["make_job", "DraftSource", "TargetSource"]
