"""The shipped drafts' measured numbers, rendered from their eval.json: the table in drafts/README.md and each
drafts/reports/<draft>/eval.md.

A number copied into prose by hand drifts from the run that measured it. Here the results file is the one source:
`python -m training.draft_table` rewrites the generated parts from every `drafts/*/eval.json` (`python -m training
eval` writes them), and `--check` changes nothing and exits 1 naming what disagrees (tests/training/
test_draft_table.py runs it on the repository, so a stale table fails the suite). The README's prose around the
generated block is free text; its own measurements say which run they come from.

    python -m training.draft_table            # after re-running an eval
    python -m training.draft_table --check
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

from training.evaluate import EvalResult, eval_markdown, tau_text

BEGIN = "<!-- generated from each draft's eval.json by `python -m training.draft_table`: do not edit by hand -->"
END = "<!-- end of the generated table -->"
_FIELDS = {f.name for f in fields(EvalResult)}


def load_report(draft_dir: Path) -> tuple[dict, list[EvalResult]] | None:
    """(eval.json's meta, its rows) of a draft directory, None without an eval.json."""
    path = draft_dir / "eval.json"
    if not path.is_file():
        return None
    report = json.loads(path.read_text())
    rows = [EvalResult(**{k: v for k, v in row.items() if k in _FIELDS}) for row in report["results"]]
    return {k: v for k, v in report.items() if k != "results"}, rows


def summary_table(drafts_dir: Path) -> str:
    """One row per draft with an eval.json: its algorithm, size on disk, and per eval set greedy τ, tokens per
    forward (where recorded) and speedup over target-only, with the settings the numbers were measured at."""
    sets: list[str] = []
    reports = {}
    for draft_dir in sorted(p for p in drafts_dir.iterdir() if p.is_dir()):
        loaded = load_report(draft_dir)
        if loaded is not None:
            reports[draft_dir] = loaded
            for r in loaded[1]:
                if r.dataset not in sets:
                    sets.append(r.dataset)
    names = " / ".join(sets)
    #: tokens per forward is recorded by evals since it exists; the column shows once any draft has it
    per_forward = any(r.tokens_per_forward is not None for _, rows in reports.values() for r in rows)
    head = (
        ["draft", "algorithm", "size", f"greedy τ {names}"]
        + ([f"tokens per forward {names}"] if per_forward else [])
        + [f"speedup {names}", "measured at"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for draft_dir, (meta, rows) in reports.items():
        greedy = {r.dataset: r for r in rows if r.temperature == 0}
        size = sum(f.stat().st_size for f in draft_dir.rglob("*") if f.is_file()) / 1e6
        settings = meta.get("settings", {})

        def per_set(cell, greedy: dict = greedy) -> str:  # greedy bound here: this draft's rows
            return " / ".join(cell(greedy[s]) if s in greedy else "-" for s in sets)

        cells = [
            draft_dir.name,
            meta.get("algo", "?"),
            f"{size:.1f} MB",
            per_set(lambda r: tau_text(r.acceptance_length)),
        ]
        if per_forward:
            cells.append(per_set(lambda r: "-" if r.tokens_per_forward is None else f"{r.tokens_per_forward:.2f}"))
        cells += [
            per_set(lambda r: f"{r.speedup:.2f}x"),
            f"{settings.get('dtype', '?')} target, {settings.get('num_prompts', '?')} prompts x "
            f"{settings.get('max_tokens', '?')} tokens, batch {settings.get('batch_size', '?')}, "
            f"k={settings.get('num_speculative_tokens', '?')}",
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def with_table(readme: str, table: str) -> str:
    """`readme` with the text between BEGIN and END replaced by `table`; ValueError without both markers."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the README holds no generated block: add the lines\n{BEGIN}\n{END}\nwhere it goes")
    return readme[: start + len(BEGIN)] + "\n" + table + "\n" + readme[end:]


def expected_files(drafts_dir: Path) -> dict[Path, str]:
    """Every generated file's path and the text it should hold."""
    out = {}
    readme = drafts_dir / "README.md"
    out[readme] = with_table(readme.read_text(), summary_table(drafts_dir))
    for draft_dir in sorted(p for p in drafts_dir.iterdir() if p.is_dir()):
        loaded = load_report(draft_dir)
        if loaded is not None:
            out[drafts_dir / "reports" / draft_dir.name / "eval.md"] = eval_markdown(loaded[1], loaded[0])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m training.draft_table", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--drafts",
        default=str(Path(__file__).resolve().parent.parent / "drafts"),
        help="the drafts folder (default: the checkout's)",
    )
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a generated file is stale")
    args = p.parse_args(argv)
    drafts_dir = Path(args.drafts)
    try:
        expected = expected_files(drafts_dir)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"training.draft_table: {e}", file=sys.stderr)
        return 2
    stale = [path for path, text in expected.items() if not path.is_file() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"stale: {path} (run python -m training.draft_table)", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(expected[path])
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
