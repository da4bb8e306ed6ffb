"""Reduce a run's `RequestOutput`s to the numbers the report prints: percentiles, throughput, goodput.

Definitions (also printed by `--help` and written to the report):
  TTFT  send -> first output-carrying chunk.        ITL   gap between successive output-carrying chunks.
  TPOT  (e2e - TTFT) / (output tokens - 1).         e2e   send -> end of response.
  request throughput = completed requests / duration; output throughput = output tokens / duration, where
  duration runs from the first send to the last response of the measured (non-warm-up) requests.
  goodput = requests that succeeded and met every given SLO, per second of duration (as `vllm bench serve`'s
  `request_goodput`). A request with one output token has no TPOT and passes a TPOT SLO.

Everything here is pure arithmetic on in-memory records, so tests can check it exactly.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from loadtest.records import RequestOutput

#: the SLO keys `--slo` accepts, each a latency in milliseconds.
SLO_KEYS = ("ttft", "tpot", "e2e")
#: the latency metrics summarised, in report order; `e2el` is vLLM's name for e2e latency.
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")


def parse_slo(text: str) -> dict[str, float]:
    """`"ttft=200,tpot=50,e2e=2000"` (milliseconds) -> {"ttft": 200.0, ...}. Raises ValueError naming the fix."""
    slo: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in SLO_KEYS:
            raise ValueError(
                f"bad SLO {part!r}: expected KEY=MILLISECONDS with KEY in {list(SLO_KEYS)}, e.g. ttft=200,tpot=50"
            )
        try:
            slo[key] = float(value)
        except ValueError:
            raise ValueError(f"bad SLO {part!r}: {value!r} is not a number of milliseconds") from None
        if slo[key] <= 0:
            raise ValueError(f"bad SLO {part!r}: the limit must be > 0 ms")
    if not slo:
        raise ValueError("empty SLO: give at least one of ttft=MS, tpot=MS, e2e=MS")
    return slo


def meets_slo(out: RequestOutput, slo: dict[str, float]) -> bool:
    """True when the request succeeded and every given limit (ms) holds."""
    if not out.success:
        return False
    if "ttft" in slo and out.ttft_s * 1000 > slo["ttft"]:
        return False
    if "e2e" in slo and out.e2e_s * 1000 > slo["e2e"]:
        return False
    tpot = out.tpot_s
    return not ("tpot" in slo and tpot is not None and tpot * 1000 > slo["tpot"])


def percentile(values: Sequence[float] | np.ndarray, q: float) -> float:
    """The `q`-th percentile (0 <= q <= 100) of `values`, NaN when there are none.

    Linear interpolation between the closest ranks (numpy's default, as `vllm bench serve`). The one percentile of
    the project: the load-test report and the benchmarks under bench/ both use it, so their p50/p99 agree."""
    if len(values) == 0:
        return math.nan
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


def summarize(values_s: Sequence[float], name: str, percentiles: Sequence[float]) -> dict[str, float]:
    """mean/median/std/pXX in milliseconds under vLLM's keys (`mean_ttft_ms`, `p99_ttft_ms`, ...).

    An empty input gives zeros, not NaN, so the JSON stays valid."""
    arr = np.asarray(values_s, dtype=np.float64) * 1000.0
    out = {
        f"mean_{name}_ms": float(arr.mean()) if arr.size else 0.0,
        f"median_{name}_ms": float(np.median(arr)) if arr.size else 0.0,
        f"std_{name}_ms": float(arr.std()) if arr.size else 0.0,
    }
    for p in percentiles:
        out[f"p{p:g}_{name}_ms"] = percentile(arr, p) if arr.size else 0.0
    return out


@dataclass(frozen=True, slots=True)
class RunMetrics:
    """The aggregate of one measured run. Field names are `vllm bench serve`'s where they overlap."""

    completed: int
    failed: int
    duration: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    request_goodput: float | None
    #: fraction of all measured requests that met the SLO (failures count against it); None without an SLO.
    slo_attainment: float | None
    errors_by_kind: dict[str, int]
    latency: dict[str, float]


def compute_metrics(
    outputs: Sequence[RequestOutput],
    duration_s: float,
    *,
    slo: dict[str, float] | None = None,
    percentiles: Sequence[float] = (90, 99),
) -> RunMetrics:
    ok = [o for o in outputs if o.success]
    failed = len(outputs) - len(ok)
    in_tok = sum(o.prompt_tokens for o in ok)
    out_tok = sum(o.output_tokens for o in ok)
    dur = duration_s if duration_s > 0 else math.nan
    latency: dict[str, float] = {}
    series = {
        "ttft": [o.ttft_s for o in ok],
        "tpot": [t for o in ok if (t := o.tpot_s) is not None],
        "itl": [x for o in ok for x in o.itl_s],
        "e2el": [o.e2e_s for o in ok],
    }
    for name in LATENCY_METRICS:
        latency.update(summarize(series[name], name, percentiles))
    good = sum(meets_slo(o, slo) for o in outputs) if slo else None
    errors = Counter(o.error_kind or "unknown" for o in outputs if not o.success)

    def per_s(x: float) -> float:
        return 0.0 if math.isnan(dur) else x / dur

    return RunMetrics(
        completed=len(ok),
        failed=failed,
        duration=duration_s,
        total_input_tokens=in_tok,
        total_output_tokens=out_tok,
        request_throughput=per_s(len(ok)),
        output_throughput=per_s(out_tok),
        total_token_throughput=per_s(in_tok + out_tok),
        request_goodput=None if good is None else per_s(good),
        slo_attainment=None if good is None or not outputs else good / len(outputs),
        errors_by_kind=dict(sorted(errors.items())),
        latency=latency,
    )
