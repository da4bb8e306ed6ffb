"""Part `engine`: our engine on the device with every drafter, chains and trees.

Per drafter, in fp32: greedy output over one batch of prompts must equal target-only decoding token for token
(requests of uneven prompts share the batch, so prefill, padding and per-row acceptance all take part), and a
seeded temperature-1 run of the same batch must finish every request. On CUDA the verification must have run as
Triton kernels (launches are counted per op). Then in bf16, batch 1: output tokens/s, beside Hugging Face
`generate` on the same weights and device (and HF's fp32 greedy tokens must equal ours).

The timed verify budget is off in the fp32 runs, so every round verifies drafts however slow the machine; the bf16
speed runs keep the engine's defaults, as a server runs it.
"""

from __future__ import annotations

import collections
import contextlib
import time

from bench.gpu_check.context import guarded
from bench.gpu_check.drafts import build_drafter_specs
from bench.gpu_check.report import FAIL, OK, Row
from bench.gpu_check.target import chat_prompts, prompt_texts

#: the launchers of plugins.kernels.launch that verification calls
VERIFY_OPS = ("greedy_accept", "rejection_sample", "tree_accept", "process_logits", "compact_kv", "confidence_truncate")
#: KV slots beyond the longest prompt and answer (the engine adds its own draft slack)
SEQ_SLACK = 64


@contextlib.contextmanager
def counted_launches(enabled: bool):
    """Count each Triton launcher call by op while the block runs; the launchers are restored after it."""
    counts: collections.Counter = collections.Counter()
    if not enabled:
        yield counts
        return
    from plugins.kernels import launch

    originals = {op: getattr(launch, op) for op in VERIFY_OPS}

    def counter(op, fn):
        def counted(*args):
            counts[op] += 1
            return fn(*args)

        return counted

    for op, fn in originals.items():
        setattr(launch, op, counter(op, fn))
    try:
        yield counts
    finally:
        for op, fn in originals.items():
            setattr(launch, op, fn)


def _token_ids(results) -> list[list[int]]:
    return [r.token_ids for r in results]


def _first_difference(got: list[list[int]], want: list[list[int]]) -> str:
    for row, (g, w) in enumerate(zip(got, want)):
        for i, (a, b) in enumerate(zip(g, w)):
            if a != b:
                return f"row {row} differs at token {i}: {a} vs target-only {b}"
        if len(g) != len(w):
            return f"row {row}: {len(g)} tokens vs target-only {len(w)}"
    return "the batches differ in size"


class EngineRun:
    """The targets (fp32 and bf16 on the device), the prompts and the target-only reference of one part run."""

    def __init__(self, context):
        from deepspec.models import load_target

        self.context, sizes = context, context.sizes
        self.t32 = load_target(str(context.target_dir), dtype="float32", device=context.device)
        self.t16 = load_target(str(context.target_dir), dtype="bfloat16", device=context.device)
        self.prompts = chat_prompts(self.t32, prompt_texts(sizes.num_prompts), sizes.max_prompt_chars)
        self.max_seq_len = max(map(len, self.prompts)) + max(sizes.max_new_tokens, sizes.max_speed_tokens) + SEQ_SLACK
        self.reference: list[list[int]] = []

    def engine(self, target, drafter, batch: int, budget: bool = True):
        from deepspec.decoding import SpecEngine
        from deepspec.decoding.planner import BudgetPlanner

        return SpecEngine(
            target,
            drafter,
            max_batch_size=batch,
            max_seq_len=self.max_seq_len,
            num_speculative_tokens=self.context.sizes.num_speculative_tokens,
            planner=BudgetPlanner() if budget else None,
        )

    def fp32_runs(self, drafter) -> tuple[list, list]:
        """(greedy results, temperature-1 results) of the whole batch."""
        from deepspec.decoding import SamplingParams

        n = self.context.sizes.max_new_tokens
        engine = self.engine(self.t32, drafter, len(self.prompts), budget=False)
        greedy = engine.generate(self.prompts, SamplingParams(max_tokens=n, ignore_eos=True))
        sampled = engine.generate(
            self.prompts,
            [SamplingParams(max_tokens=n, temperature=1.0, seed=i, ignore_eos=True) for i in range(len(self.prompts))],
        )
        return greedy, sampled

    def bf16_tokens_per_second(self, drafter) -> float:
        from deepspec.decoding import SamplingParams

        sizes = self.context.sizes
        engine = self.engine(self.t16, drafter, 1)
        params = SamplingParams(max_tokens=sizes.max_speed_tokens, ignore_eos=True)
        engine.generate(self.prompts[:1], SamplingParams(max_tokens=8, ignore_eos=True))  # kernels compile here
        self.context.synchronize()
        t0 = time.perf_counter()
        num_tokens = sum(
            len(engine.generate([p], params)[0].token_ids) for p in self.prompts[: sizes.num_speed_prompts]
        )
        self.context.synchronize()
        return num_tokens / (time.perf_counter() - t0)

    def hf_rows(self) -> list[Row]:
        """Hugging Face generate on the same directory and device: fp32 greedy tokens against ours, bf16 tok/s."""
        import torch
        from transformers import AutoModelForCausalLM

        sizes, device = self.context.sizes, self.context.device
        prompts = self.prompts[: sizes.num_speed_prompts]
        pad = self.t32.eos_token_ids[0]
        rows = []
        with torch.inference_mode():
            hf = AutoModelForCausalLM.from_pretrained(self.context.target_dir, dtype=torch.float32).to(device).eval()
            # transformers types generate's self as a Protocol its own auto-model class does not satisfy
            generate = hf.generate  # pyright: ignore[reportAttributeAccessIssue]
            n = sizes.max_new_tokens
            # no min_new_tokens here: it would mask EOS where our reference (ignore_eos) emits it; HF stops after
            # an EOS instead, so its answer is compared with the reference's prefix of the same length
            got = [
                generate(torch.tensor([p], device=device), max_new_tokens=n, do_sample=False, pad_token_id=pad)[
                    0, len(p) :
                ].tolist()
                for p in prompts
            ]
            want = [ref[: len(g)] for ref, g in zip(self.reference, got)]
            same = got == want
            rows.append(
                Row(
                    "hf-generate fp32 greedy",
                    OK if same else FAIL,
                    "identical to our target-only" if same else _first_difference(got, want),
                )
            )
            del hf, generate  # the bound method holds the model too
            hf = AutoModelForCausalLM.from_pretrained(self.context.target_dir, dtype=torch.bfloat16).to(device).eval()
            generate = hf.generate  # pyright: ignore[reportAttributeAccessIssue] (as above)
            m = sizes.max_speed_tokens
            generate(torch.tensor([prompts[0]], device=device), max_new_tokens=8, do_sample=False, pad_token_id=pad)
            self.context.synchronize()
            t0 = time.perf_counter()
            num_tokens = 0
            for p in prompts:
                out = generate(
                    torch.tensor([p], device=device),
                    max_new_tokens=m,
                    min_new_tokens=m,
                    do_sample=False,
                    pad_token_id=pad,
                )
                num_tokens += out.shape[1] - len(p)
            self.context.synchronize()
            rows.append(
                Row(
                    "hf-generate bf16 batch 1",
                    OK,
                    "",
                    {"bf16_tok_s": round(num_tokens / (time.perf_counter() - t0), 1)},
                )
            )
        return rows


def drafter_row(run: EngineRun, label: str, build) -> Row:
    """One drafter: fp32 greedy identity and temperature-1 completion, kernel launches on CUDA, bf16 tok/s."""
    from training.evaluate import summarize

    on_cuda = run.context.device == "cuda"
    with counted_launches(on_cuda) as launches:
        greedy, sampled = run.fp32_runs(build(run.t32))
    metrics = {}
    problems = []
    if _token_ids(greedy) != run.reference:
        problems.append(
            "greedy output differs from target-only: " + _first_difference(_token_ids(greedy), run.reference)
        )
    if not all(len(r.token_ids) == run.context.sizes.max_new_tokens for r in sampled):
        problems.append("a temperature-1 request stopped short")
    tau = summarize(greedy)[0]  # eval's τ: over the rounds that verified drafts
    if tau is not None:
        metrics["acceptance_length"] = round(tau, 3)
    metrics["draft_tokens"] = sum(r.num_draft_tokens for r in greedy)
    if on_cuda:
        metrics["launches"] = dict(launches)
        if metrics["draft_tokens"] and not any(launches[op] for op in ("greedy_accept", "tree_accept")):
            problems.append("no greedy verification ran as a Triton kernel")
        if sum(r.num_draft_tokens for r in sampled) and not any(
            launches[op] for op in ("rejection_sample", "tree_accept")
        ):
            problems.append("no sampled verification ran as a Triton kernel")
    metrics["bf16_tok_s"] = round(run.bf16_tokens_per_second(build(run.t16)), 1)
    # prompt lookup drafts only where a random target's answer repeats an n-gram: it may propose nothing
    detail = "greedy identical to target-only" + ("" if metrics["draft_tokens"] else " (it proposed no drafts)")
    return Row(label, FAIL if problems else OK, "; ".join(problems) or detail, metrics)


def run(context) -> list[Row]:
    from deepspec.decoding import SamplingParams, build_drafter

    engine_run = EngineRun(context)
    base = engine_run.engine(engine_run.t32, None, len(engine_run.prompts))
    greedy = base.generate(engine_run.prompts, SamplingParams(max_tokens=context.sizes.max_new_tokens, ignore_eos=True))
    engine_run.reference = _token_ids(greedy)
    rows = [Row("target-only", OK, "the reference", {"bf16_tok_s": round(engine_run.bf16_tokens_per_second(None), 1)})]
    rows += guarded(context, "hf-generate", engine_run.hf_rows)
    sequences = [p + r for p, r in zip(engine_run.prompts, engine_run.reference)]
    specs = build_drafter_specs(
        engine_run.t32, sequences, context.workdir / "drafts", context.sizes.num_speculative_tokens
    )
    for spec in specs:

        def one(spec=spec):
            return [drafter_row(engine_run, spec.label, lambda t: build_drafter(spec.spec, t, **spec.options))]

        rows += guarded(context, spec.label, one)
    return rows
