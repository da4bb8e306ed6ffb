"""Side-by-side comparison of two JSON reports, with ratios: e.g. a run with a draft vs one without.

`ratio` is B / A. Whether that is good depends on the metric (throughput up is better, latency down is better),
so each row also says which direction wins. Sweeps are compared point by point, in order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

#: (report key, label, higher is better)
ROWS = (
    ("completed", "successful requests", True),
    ("failed", "failed requests", False),
    ("duration", "duration (s)", False),
    ("request_throughput", "request throughput (req/s)", True),
    ("request_goodput", "request goodput (req/s)", True),
    ("slo_attainment", "SLO attainment (fraction)", True),
    ("output_throughput", "output throughput (tok/s)", True),
    ("mean_ttft_ms", "mean TTFT (ms)", False),
    ("median_ttft_ms", "median TTFT (ms)", False),
    ("p99_ttft_ms", "p99 TTFT (ms)", False),
    ("mean_tpot_ms", "mean TPOT (ms)", False),
    ("median_tpot_ms", "median TPOT (ms)", False),
    ("p99_tpot_ms", "p99 TPOT (ms)", False),
    ("median_itl_ms", "median ITL (ms)", False),
    ("p99_itl_ms", "p99 ITL (ms)", False),
    ("median_e2el_ms", "median e2e latency (ms)", False),
    ("p99_e2el_ms", "p99 e2e latency (ms)", False),
    ("spec_decode.acceptance_length", "mean acceptance length (tokens)", True),
    ("spec_decode.acceptance_rate", "acceptance rate", True),
)


@dataclass(frozen=True, slots=True)
class Row:
    label: str
    a: float | None
    b: float | None
    #: b / a, None when either is missing or a is 0
    ratio: float | None
    higher_is_better: bool

    @property
    def b_better(self) -> bool | None:
        if self.ratio is None or self.ratio == 1.0:
            return None
        return (self.ratio > 1.0) == self.higher_is_better


def load_report(path: str | Path) -> dict:
    path = Path(path)
    try:
        rep = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such report; write one with --result-file") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not a JSON report: {e}") from None
    if not isinstance(rep, dict) or not ("runs" in rep or "completed" in rep):
        raise ValueError(f"{path} is not a loadtest report (no 'completed' or 'runs' field)")
    return rep


def _get(rep: dict, key: str) -> float | None:
    value: object = rep
    for part in key.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def compare_points(a: dict, b: dict) -> list[Row]:
    rows = []
    for key, label, higher in ROWS:
        va, vb = _get(a, key), _get(b, key)
        if va is None and vb is None:
            continue
        ratio = vb / va if va not in (None, 0.0) and vb is not None else None
        rows.append(Row(label, va, vb, ratio, higher))
    return rows


def point_title(rep: dict) -> str:
    rate = rep.get("request_rate")
    conc = rep.get("max_concurrency")
    return f"{rep.get('arrival', '?')}, rate {rate}, max concurrency {conc or 'none'}"


def compare_reports(a: dict, b: dict) -> list[tuple[str, list[Row]]]:
    """[(title, rows)] for each pair of points; single reports give one pair."""
    runs_a = a.get("runs", [a])
    runs_b = b.get("runs", [b])
    if len(runs_a) != len(runs_b):
        raise ValueError(
            f"the reports have {len(runs_a)} and {len(runs_b)} load points; compare sweeps over the same points"
        )
    return [(point_title(pa), compare_points(pa, pb)) for pa, pb in zip(runs_a, runs_b)]
