"""`python -m plugins.gpu_smoke`: the engine on a CUDA GPU verifying through the Triton kernels.

`python -m plugins check` compares each kernel with the reference on synthetic inputs; this runs the real thing:
the default target (smollm2-135m, fp32) on CUDA with the shipped draft (`auto`) and with prompt lookup, over a few
HumanEval prompts at batch 8. It checks that greedy speculation is token-identical to target-only decoding, that
temperature-1 runs finish, and that the verify ops really ran as Triton kernels (launch counts per op), and prints
output tokens/s per run (greedy vs temperature 1, the service benchmark's ratio on one GPU). Exit status 1 when a
check fails or there is no GPU.
"""

from __future__ import annotations

import collections
import sys
import time


def _count_launches(counts: collections.Counter) -> None:
    """Wrap each launcher of plugins.kernels.launch so every call on a CUDA tensor is counted by op."""
    from plugins.kernels import launch

    for op in ("greedy_accept", "rejection_sample", "process_logits", "tree_accept", "compact_kv",
               "confidence_truncate"):
        fn = getattr(launch, op)

        def counted(*args, _fn=fn, _op=op):
            counts[_op] += 1
            return _fn(*args)
        setattr(launch, op, counted)


def main(argv: list[str] | None = None) -> int:
    import torch

    if not torch.cuda.is_available():
        print("plugins gpu_smoke: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 1
    import json

    from deepspec.decoding import SamplingParams, SpecEngine
    from deepspec.decoding.registry import build_drafter
    from deepspec.models import load_target
    from deepspec.paths import eval_dataset

    counts: collections.Counter = collections.Counter()
    _count_launches(counts)
    target = load_target("smollm2-135m", dtype="float32", device="cuda")
    lines = eval_dataset("humaneval").read_text().splitlines()[:8]
    prompts = [target.encode_chat([{"role": "user", "content": json.loads(line)["turns"][0]}]) for line in lines]

    def run(drafter_spec: str, temperature: float):
        drafter = build_drafter(drafter_spec, target)
        engine = SpecEngine(target, drafter, max_batch_size=8, max_seq_len=1024)
        params = [SamplingParams(max_tokens=64, temperature=temperature, seed=i) for i in range(len(prompts))]
        engine.generate(prompts[:1], params[0])  # warm-up: Triton compiles the kernels here
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        results = engine.generate(prompts, params)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        return [r.token_ids for r in results], sum(len(r.token_ids) for r in results) / wall

    failures = []
    reference, base_tps = run("none", 0.0)
    print(f"target only, greedy: {base_tps:.1f} tok/s")
    for spec in ("auto", "prompt-lookup"):
        before = collections.Counter(counts)
        greedy, greedy_tps = run(spec, 0.0)
        sampled, sampled_tps = run(spec, 1.0)
        launched = {op: n - before[op] for op, n in counts.items() if n - before[op]}
        same = greedy == reference
        print(f"{spec}: greedy {greedy_tps:.1f} tok/s (identical to target only: {same}), temperature 1 "
              f"{sampled_tps:.1f} tok/s ({sampled_tps / greedy_tps:.2f}x of greedy); kernel launches {launched}")
        if not same:
            failures.append(f"{spec}: greedy speculation differs from target-only decoding")
        if not any(op in launched for op in ("rejection_sample", "tree_accept")):
            failures.append(f"{spec}: no sampled verification ran as a Triton kernel")
        if not all(len(s) > 0 for s in sampled):
            failures.append(f"{spec}: a temperature-1 request produced no tokens")
    for failure in failures:
        print(f"FAIL {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
