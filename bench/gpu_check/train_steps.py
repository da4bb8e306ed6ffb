"""Part `training`: a few optimizer steps of each algorithm (Eagle3, DFlash, DSpark) on the device, through the
real `Trainer` (training/trainer.py: the target in the loop, bf16 autocast on CUDA, AdamW, the final save).

The data are conversations whose answers are the target's own greedy continuations, decoded here, so the rows
have the shape `python -m training prepare` writes. A row passes when every step ran, every loss is finite and
the final draft directory was written; the first and last loss and tokens/s are reported, not judged (20 steps
from a random init say nothing about a recipe).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from bench.gpu_check.context import guarded
from bench.gpu_check.drafts import NEURAL_ALGOS
from bench.gpu_check.report import FAIL, OK, Row
from bench.gpu_check.target import prompt_texts

NUM_CONVERSATIONS = 16


def write_conversations(context, path: Path) -> Path:
    """Conversations of the shipped prompts and the target's fp32 greedy answers (what `prepare` would write)."""
    from deepspec.decoding import SamplingParams, SpecEngine
    from deepspec.models import load_target

    sizes = context.sizes
    target = load_target(str(context.target_dir), dtype="float32", device=context.device)
    texts = [t[: sizes.max_prompt_chars] for t in prompt_texts(NUM_CONVERSATIONS)]
    prompts = [target.encode_chat([{"role": "user", "content": t}]) for t in texts]
    longest = max(map(len, prompts))
    answer_tokens = max(8, sizes.train_max_len - longest)
    engine = SpecEngine(target, None, max_batch_size=len(prompts), max_seq_len=longest + answer_tokens)
    results = engine.generate(prompts, SamplingParams(max_tokens=answer_tokens, ignore_eos=True))
    with path.open("w") as f:
        for i, (text, result) in enumerate(zip(texts, results)):
            f.write(
                json.dumps(
                    {
                        "id": f"gpu-check:{i}",
                        "conversations": [
                            {"role": "user", "content": text},
                            {"role": "assistant", "content": result.text},
                        ],
                    }
                )
                + "\n"
            )
    return path


def train_config(context, algo: str, data: Path, out: Path):
    from training.config import TrainConfig

    sizes = context.sizes
    on_cuda = context.device == "cuda"
    return TrainConfig.model_validate(
        {
            "target": {
                "name": str(context.target_dir),
                "device": context.device,
                "dtype": "bfloat16" if on_cuda else "float32",
            },
            "model": {
                "algo": algo,
                "block_size": sizes.num_speculative_tokens,
                "draft_vocab_size": 256,
                "calibration_sequences": 2,
            },
            "data": {"paths": [str(data)], "max_len": sizes.train_max_len, "num_anchors": 16},
            "optim": {"max_steps": sizes.num_train_steps, "warmup_steps": 2, "lr": 1e-3},
            "output_dir": str(out),
            "save_every": 0,
        }
    )


def algo_row(context, algo: str, data: Path) -> Row:
    from training.trainer import train

    out = context.workdir / "train" / algo
    summary = train(train_config(context, algo, data, out), show_progress=False, log=lambda line: None)
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    losses = [entry["loss"] for entry in log]
    problems = []
    if summary["steps"] != context.sizes.num_train_steps:
        problems.append(
            f"stopped after {summary['steps']} of {context.sizes.num_train_steps} steps ({summary['stopped']})"
        )
    if not all(math.isfinite(x) for x in losses):
        problems.append(f"non-finite loss: {losses}")
    if not (out / "config.json").is_file():
        problems.append("no final draft written")
    metrics = {
        "steps": summary["steps"],
        "first_loss": round(losses[0], 4) if losses else None,
        "last_loss": round(losses[-1], 4) if losses else None,
        "tok_s": summary["tokens_per_second"],
    }
    return Row(f"train {algo}", FAIL if problems else OK, "; ".join(problems), metrics)


def run(context) -> list[Row]:
    data = write_conversations(context, context.workdir / "conversations.jsonl")
    rows = []
    for algo in NEURAL_ALGOS:
        rows += guarded(context, f"train {algo}", lambda algo=algo: [algo_row(context, algo, data)])
    return rows
