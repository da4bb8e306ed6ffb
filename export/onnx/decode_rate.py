"""Decode throughput of candidate exports, measured the way the worker serves them: what `--quantization auto`
chooses by.

Why measured rather than modelled from step curves and the draft's τ: on this project's 2-core Xeon with AMX the
model picked int8 + DSpark (94 modelled tokens/s against int4's 89) and int4 + DSpark then decoded 10-30% faster on
all three eval sets. Two inputs of the model were wrong there:
- the draft's τ comes from its eval.json, measured on the fp32 target; on a quantized target, whose greedy tokens
  and features differ, DSpark accepted 1.25-1.6 instead of 2.33;
- the recorded step curve is the fastest of 15 runs per size (load only slows a run), and the int8 graph's fastest
  1-token step was 11.1 ms where its median was 17.6.
A short decode of a few prompts on each candidate measures both, and the draft's cost and the engine's own overhead
with them.

The prompts are four of the training sets' (`datasets/train`), chat-rendered by the target: never the eval prompts
the benchmarks report on, and none that any shipped draft was built from. The corpus draft holds the target's
answers to 4,856 training prompts and replays them nearly verbatim: on its own prompts the int8 graph, whose greedy
answers stay closer to the fp32 ones, accepted τ 2.7 against int4's 1.7, which says nothing about new prompts. So
the calibration lines lie outside the seeded draw that `python -m training prepare --limit-per-file 4000 --seed 0`
makes (training/data/README.md), which every shipped draft's data comes from. The candidates take turns prompt by
prompt, so a VM's drift over the minute the measurement takes hits every candidate alike; each candidate's rate is
its median over the prompts.
"""

from __future__ import annotations

import gzip
import json
import statistics
import time
from pathlib import Path

#: datasets/train/<name>.jsonl.gz -> the 1-based lines whose prompts calibrate the choice: the first two of each set
#: outside the training data's seeded draw (module docstring; a test checks it against the draw and the data)
CALIBRATION_LINES = {"codealpaca": (8, 11), "gsm8k_train": (8, 15)}
#: new tokens per prompt: ~10 s per candidate on 2 cores for SmolLM2-135M
CALIBRATION_TOKENS = 64
#: tokens of the warm-up decode that runs before any prompt is timed (first-call allocations, thread-pool spin-up)
WARMUP_TOKENS = 8


def calibration_turns() -> list[str]:
    """The calibration prompts' texts (CALIBRATION_LINES), in order; [] for a set the checkout does not hold (an
    installed package without datasets/)."""
    from deepspec.paths import datasets_dir

    turns = []
    for name, line_numbers in CALIBRATION_LINES.items():
        path = datasets_dir() / "train" / f"{name}.jsonl.gz"
        if not path.is_file():
            continue
        with gzip.open(path, "rt", encoding="utf-8") as f:
            lines = f.read().splitlines()
        turns += [json.loads(lines[n - 1])["turns"][0] for n in line_numbers if n <= len(lines)]
    return turns


def calibration_prompts(target) -> list[list[int]]:
    """The calibration prompts as `target`'s chat-rendered ids."""
    return [target.encode_chat([{"role": "user", "content": t}]) for t in calibration_turns()]


def served_drafter(target):
    """The drafter the worker serves an ONNX export (`target`, loaded) with: its copied draft directory, the drafter
    it names (prompt lookup), or None."""
    from deepspec.decoding import build_drafter
    from export.onnx.exporter import exported_draft_dir

    draft_dir = exported_draft_dir(target.path, target.meta)
    name = (target.meta.get("draft") or {}).get("path") or "none"
    if draft_dir is not None:
        return build_drafter(str(draft_dir), target)
    return None if name == "none" else build_drafter(name, target)


def measure_decode_rates(
    exports: dict[str, Path], depth: int, max_tokens: int = CALIBRATION_TOKENS
) -> dict[str, dict] | None:
    """{candidate: {"tokens_per_second": median over the calibration prompts, "acceptance_length": mean τ or
    None}} of each export in `exports`, decoded greedily at batch 1 by the engine as served (verification budget
    on, `depth` drafts at most); None when there are no calibration prompts to decode."""
    from deepspec.models import load_target

    targets = {name: load_target(str(export_dir)) for name, export_dir in exports.items()}
    return measure_served_rates(
        {name: (target, served_drafter(target)) for name, target in targets.items()}, depth, max_tokens
    )


def measure_served_rates(
    candidates: dict[str, tuple], depth: int, max_tokens: int = CALIBRATION_TOKENS
) -> dict[str, dict] | None:
    """The same measurement for any {candidate: (target, drafter or None)}: each decodes the calibration prompts
    greedily at batch 1 with the verification budget on, the candidates in turn prompt by prompt. What the worker's
    engine choice (service/worker/fastest_backend.py) and `--quantization auto` decide by."""
    from deepspec.decoding import SamplingParams, SpecEngine
    from deepspec.decoding.planner import BudgetPlanner

    first = next(iter(candidates.values()))[0]  # the candidates share a tokenizer and a context length
    room = min(t.max_seq_len for t, _ in candidates.values()) - max_tokens - depth - 2
    prompts = [p[-room:] for p in calibration_prompts(first)]  # past a small target's context, a prompt keeps its end
    if not prompts:
        return None
    longest = max(len(p) for p in prompts) + max_tokens + depth + 2
    engines = {}
    for name, (target, drafter) in candidates.items():
        # the served engine's own curve file: the calibration's passes correct it before serving starts
        engine = SpecEngine(
            target,
            drafter,
            max_batch_size=1,
            max_seq_len=min(target.max_seq_len, longest),
            num_speculative_tokens=depth,
            planner=BudgetPlanner.kept_per_machine(target, drafter),
        )
        engine.generate([prompts[0]], SamplingParams(max_tokens=WARMUP_TOKENS))
        engine.forget_acceptance()
        engines[name] = engine
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    rates: dict[str, list[float]] = {name: [] for name in engines}
    taus: dict[str, list[float]] = {name: [] for name in engines}
    for prompt in prompts:
        for name, engine in engines.items():  # in turn, prompt by prompt (module docstring)
            start = time.perf_counter()
            result = engine.generate([prompt], params)[0]
            rates[name].append(len(result.token_ids) / (time.perf_counter() - start))
            if result.acceptance_length is not None:
                taus[name].append(result.acceptance_length)
    return {
        name: {
            "tokens_per_second": round(statistics.median(rates[name]), 1),
            "acceptance_length": round(statistics.fmean(taus[name]), 3) if taus[name] else None,
        }
        for name in engines
    }
