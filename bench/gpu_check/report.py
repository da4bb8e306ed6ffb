"""What every part returns, the table it prints and the JSON it writes: the contract between the parts and the
command line, with no behaviour of its own.

A part yields `Row`s (one checked thing each: a kernel, a drafter, an algorithm) and ends as a `PartResult`. A row's
status is `ok`, `FAIL` or `skipped`; `skipped` always carries its reason in `detail`, so a table that reads
"skipped" never hides why.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

OK, FAIL, SKIPPED = "ok", "FAIL", "skipped"


@dataclass
class Row:
    item: str
    status: str
    detail: str = ""
    #: numbers a reader compares across runs (tok/s, acceptance length, max abs error), by name with units
    metrics: dict = field(default_factory=dict)


@dataclass
class PartResult:
    part: str
    status: str
    seconds: float
    rows: list[Row] = field(default_factory=list)
    #: why the whole part failed or was skipped (an exception, a missing module), else ""
    detail: str = ""


def part_status(rows: list[Row]) -> str:
    """FAIL if any row failed, skipped if every row was skipped (or there are none), else ok."""
    if any(r.status == FAIL for r in rows):
        return FAIL
    if not rows or all(r.status == SKIPPED for r in rows):
        return SKIPPED
    return OK


def _metric_text(metrics: dict) -> str:
    return "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())


def table(results: list[PartResult]) -> str:
    """One line per row under a line per part: `part  item  status  detail  metrics`."""
    lines = [f"{'part':<9} {'item':<40} {'status':<8} detail"]
    for result in results:
        lines.append(
            f"{result.part:<9} {'(part, ' + format(result.seconds, '.1f') + ' s)':<40} {result.status:<8} "
            f"{result.detail}"
        )
        for row in result.rows:
            text = " ".join(filter(None, [row.detail, _metric_text(row.metrics)]))
            lines.append(f"{'':<9} {row.item:<40} {row.status:<8} {text}")
    failed = [r.part for r in results if r.status == FAIL]
    lines.append(
        f"{len(results) - len(failed)} parts without failures, {len(failed)} failed"
        + (f": {', '.join(failed)}" if failed else "")
    )
    return "\n".join(lines)


def write_json(path: Path, environment: dict, sizes: dict, results: list[PartResult], complete: bool) -> Path:
    """The report; `complete` is false while parts are still to run (a run cut short keeps what it measured)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "environment": environment,
        "sizes": sizes,
        "complete": complete,
        "parts": [asdict(r) for r in results],
        "failed": [r.part for r in results if r.status == FAIL],
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path
