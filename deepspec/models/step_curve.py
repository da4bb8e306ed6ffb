"""A target's verify-step curve on this machine: seconds for one batch-1 forward of T new tokens, and what it says
about speculative throughput.

Why one place: three callers need the same measurement. The ONNX export chooses its weight format by it
(`--quantization auto`: int8 where the CPU's int8 dot products keep a multi-token step flat, int4 where the
4-bit kernels win), the worker chooses between the PyTorch and the ONNX engine by it (service/worker/
fastest_backend.py), and the engine's verification budget reads the recorded curve instead of probing again
(deepspec/decoding/verify_budget.py). A curve is only meaningful on the machine and thread count that measured it,
so it travels with `machine_key()` and is ignored elsewhere.

The figure of merit a choice compares is the budget's own (`verify_budget.modelled_tokens_per_second`): the
throughput at the verify depth the budget would pick on that curve for a draft of the measured acceptance length,
a neural draft's round cost on that candidate added (deepspec/decoding/draft_time.py times it);
`drafter_acceptance_length` below says which τ a drafter is scored with.
"""

from __future__ import annotations

import platform
import statistics
import time
from pathlib import Path

import torch

#: the flags that change the kernels' speed (int8 dot products, bf16, AMX tiles)
SIMD_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8")
#: verify widths timed (the engine verifies at most 32 tokens a pass by default)
CURVE_SIZES = (1, 2, 4, 8, 16, 32)
#: context before the timed step: a verify pass after a short prompt
CURVE_CONTEXT = 256


def cpu_flags() -> str:
    """The SIMD flags of /proc/cpuinfo this machine has, e.g. 'avx2 fma f16c'."""
    try:
        line = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"
    have = set(line.split(":", 1)[1].split())
    return " ".join(f for f in SIMD_FLAGS if f in have) or "none of " + ", ".join(SIMD_FLAGS)


def cpu_model() -> str:
    """/proc/cpuinfo's model name ('AMD EPYC 9R14'), or the platform's processor string."""
    try:
        line = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name"))
        return line.split(":", 1)[1].strip()
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def machine_key(threads: int | None = None) -> dict:
    """What a step curve depends on besides the model: the CPU, its SIMD flags and the intra-op threads."""
    return {"cpu": cpu_model(), "flags": cpu_flags(), "threads": int(threads or torch.get_num_threads())}


def measure_step_curve(
    target,
    sizes: tuple[int, ...] = CURVE_SIZES,
    context: int = CURVE_CONTEXT,
    repeats: int = 7,
    feature_layers: tuple[int, ...] = (),
    fastest: bool = False,
) -> dict[int, float]:
    """{T: median seconds} of batch-1 forwards of T tokens (logits at every position, as a verify pass) after
    `context` tokens; the context is prefilled once and every step overwrites the same cache positions. Rounds
    interleave the sizes, so a drift of the machine's speed spreads over all of them. `fastest`: the fastest run of
    each size instead of the median (`measure_recorded_curve`)."""
    cache = target.new_cache(1, context + max(sizes) + 1)
    view = cache.rows(0, 1)
    rng = torch.Generator().manual_seed(0)
    device = getattr(target, "device", torch.device("cpu"))
    with torch.inference_mode():
        prompt = torch.randint(0, target.vocab_size, (1, context), generator=rng).to(device)
        target.forward(prompt, torch.zeros(1, dtype=torch.long, device=device), view, logits="last", max_start=0)
        start = torch.tensor([context], device=device)
        steps = {n: torch.randint(0, target.vocab_size, (1, n), generator=rng).to(device) for n in sizes}

        def timed(n: int) -> float:
            t = time.perf_counter()
            target.forward(steps[n], start, view, feature_layers=feature_layers, logits="all", max_start=context)
            return time.perf_counter() - t

        for n in sizes:
            timed(n)  # kernel setup stays out of the timings
        runs: dict[int, list[float]] = {n: [] for n in sizes}
        for _ in range(repeats):
            for n in sizes:
                runs[n].append(timed(n))
    statistic = min if fastest else statistics.median
    return {n: statistic(runs[n]) for n in sizes}


#: timed runs per size of a curve that is recorded (`measure_recorded_curve`)
RECORD_REPEATS = 15


def measure_recorded_curve(target) -> dict[int, float]:
    """The curve an export records and the engine choice compares: the fastest of RECORD_REPEATS runs of each
    size. Load on the machine only ever slows a run, and a recorded curve steers the verification budget for as
    long as its export is cached: a median of 7 taken once under load read 18.5 ms for the 1-token step of a
    graph whose quiet median was 13.1 ms."""
    return measure_step_curve(target, repeats=RECORD_REPEATS, fastest=True)


def curve_record(curve: dict[int, float], threads: int | None = None) -> dict:
    """The JSON form a manifest stores: {"machine": machine_key(), "ms": {"T": milliseconds}}."""
    return {"machine": machine_key(threads), "ms": {str(n): round(s * 1e3, 3) for n, s in sorted(curve.items())}}


def recorded_times(record: dict | None, threads: int | None = None) -> dict[int, float] | None:
    """A stored `curve_record` → {size: seconds}, or None when it is missing, malformed, or was measured on another
    machine or thread count (its timings would not describe this one)."""
    if not isinstance(record, dict) or record.get("machine") != machine_key(threads):
        return None
    try:
        return {int(n): float(ms) / 1e3 for n, ms in record["ms"].items()}
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def recorded_curve(record: dict | None, threads: int | None = None) -> dict[int, float] | None:
    """A stored verify-step curve → {T: seconds}: `recorded_times`, and None unless it holds two sizes or more, every
    step taking some time."""
    curve = recorded_times(record, threads)
    return curve if curve is not None and len(curve) >= 2 and all(t > 0 for t in curve.values()) else None


#: the verify depth a choice is scored at: the worker's default --num-speculative-tokens
SCORED_DEPTH = 7
#: τ assumed for a drafter with no measured acceptance length (prompt lookup, an unevaluated draft)
NOMINAL_ACCEPTANCE_LENGTH = 2.0


def drafter_acceptance_length(draft_dir: Path | None, drafter: str | None = None) -> float:
    """τ a format choice is scored with: the draft directory's measured greedy acceptance length (its eval.json),
    NOMINAL_ACCEPTANCE_LENGTH for a drafter without one, 1 (target-only steps) with no drafter at all."""
    if draft_dir is not None:
        from deepspec.models.drafts import measured_acceptance_length

        return measured_acceptance_length(draft_dir) or NOMINAL_ACCEPTANCE_LENGTH
    return 1.0 if drafter in (None, "", "none") else NOMINAL_ACCEPTANCE_LENGTH
