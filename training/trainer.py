"""The training loop shared by the three algorithms: frozen target → features → draft loss → AdamW.

One optimizer step = `grad_accum` micro-batches; warmup + cosine schedule; clipping; checkpoints every
`save_every` steps hold everything a bit-for-bit resume needs (weights, optimizer, scheduler, torch RNG, anchor
RNG, data position). Under `torchrun` each rank reads its shard of every epoch and DDP (or FSDP) averages
gradients; rank 0 writes checkpoints.
"""

from __future__ import annotations

import json
import math
import os
import resource
import shutil
import sys
import time
from pathlib import Path

import torch
from torch import nn

from training.config import TrainConfig
from training.data import DataStats, SequenceOrder, build_draft_vocab, collate, load_sequences
from training.losses import dflash_loss, dspark_loss, eagle3_loss
from training.parallel import Parallel


class DraftObjective(nn.Module):
    """draft + its loss as one module, so DDP/FSDP see a single forward per micro-batch."""

    def __init__(self, draft, target, num_anchors: int, anchor_generator: torch.Generator):
        super().__init__()
        self.draft = draft
        self.target = target  # a dataclass, not a module: its frozen weights stay out of the optimizer and DDP
        self.num_anchors = num_anchors
        self.anchor_generator = anchor_generator

    def forward(self, features, final_hidden, tokens, loss_mask):
        algo = self.draft.cfg.algo
        if algo == "eagle3":
            loss, metrics = eagle3_loss(self.draft, self.target, features, final_hidden, tokens, loss_mask)
        else:
            fn = dflash_loss if algo == "dflash" else dspark_loss
            loss, metrics = fn(self.draft, self.target, features, final_hidden, tokens, loss_mask,
                               self.anchor_generator, self.num_anchors)
        # every parameter takes part in every step (DDP needs that), even on a batch with nothing to learn
        loss = loss + 0.0 * sum(p.sum() for p in self.draft.parameters())
        return loss, metrics


def lr_lambda(cfg: TrainConfig):
    warmup, total, floor = cfg.optim.warmup_steps, cfg.optim.max_steps, cfg.optim.min_lr_ratio

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class _Dist:
    def __init__(self, cfg: TrainConfig):
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = cfg.target.device
        if device.startswith("cuda") and self.world_size > 1:
            device = f"cuda:{self.local_rank}"
            torch.cuda.set_device(device)
        self.device = device
        if self.world_size > 1 and not torch.distributed.is_initialized():
            backend = cfg.dist.backend if cfg.dist.backend != "auto" else (
                "nccl" if device.startswith("cuda") else "gloo")
            torch.distributed.init_process_group(backend)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world_size > 1:
            torch.distributed.barrier()


def initial_draft(cfg: TrainConfig, target):
    """The draft named by `init_from`, to fine-tune on more data: its weights, vocabulary and sizes are kept, so
    it must be of the configured algorithm and trained for this target."""
    from deepspec.models.drafts import check_target, load_draft

    path = Path(cfg.init_from)
    draft = load_draft(path, dtype=torch.float32)  # no target: attaching would also prepack it for inference
    if draft.cfg.algo != cfg.model.algo:
        raise ValueError(f"init_from {path} is a {draft.cfg.algo} draft, but model.algo is {cfg.model.algo}")
    check_target(draft.cfg, target, where=f"init_from draft {path}")
    return draft.train()


def latest_checkpoint(output_dir: Path) -> Path | None:
    ckpts = sorted((output_dir / "checkpoints").glob("step_*"))
    ckpts = [c for c in ckpts if (c / "trainer_state.pt").is_file()]
    return ckpts[-1] if ckpts else None


def train(cfg: TrainConfig, *, resume: bool = False, show_progress: bool = True,
          stop_at_step: int | None = None, log=None) -> dict:
    """Train one draft; returns a summary dict (also written to <output_dir>/train_summary.json).

    `stop_at_step` ends the run early as if interrupted (tests of --resume); `log(str)` receives status lines."""
    from deepspec.models import load_target
    from deepspec.models.drafts import DraftConfig, build_draft, save_draft
    from training.features import OfflineFeatures, OnlineFeatures, estimate_cache_bytes
    from training.progress import Progress

    log = log or (lambda s: None)
    dist = _Dist(cfg)
    out = Path(cfg.output_dir)
    target = load_target(cfg.target.name, dtype=cfg.target.dtype, device=dist.device)
    stats = DataStats()
    sequences = load_sequences(cfg.data.paths, target.tokenizer, cfg.data.max_len, stats)
    if stats.num_malformed:
        log(f"skipped {stats.num_malformed} malformed rows (first: {stats.problems[0]})")
    log(f"{len(sequences)} sequences, {stats.num_tokens:,} tokens ({stats.num_loss_tokens:,} assistant)")

    m = cfg.model
    # DSpark holds out the last rows to calibrate its confidence head on text it never trained on
    num_calibration = min(m.calibration_sequences, len(sequences) // 10) if m.algo == "dspark" else 0
    num_train = len(sequences) - num_calibration
    torch.manual_seed(cfg.seed)
    if cfg.init_from is not None:
        draft = initial_draft(cfg, target)
        dcfg = draft.cfg
        log(f"starting from the weights and vocabulary of {cfg.init_from}")
    else:
        dcfg = DraftConfig.for_target(
            target, m.algo, num_layers=m.num_layers, block_size=m.block_size,
            draft_vocab_size=min(m.draft_vocab_size, target.vocab_size), markov_rank=m.markov_rank,
            feature_layers=tuple(m.feature_layers) if m.feature_layers else None, layout=m.layout)
        draft = build_draft(dcfg)
        if dcfg.draft_vocab_size:
            draft.set_vocab(build_draft_vocab(sequences[:num_train], dcfg.draft_vocab_size, target.vocab_size,
                                              target.eos_token_ids))
        draft = draft.to(dist.device).attach(target)
        draft.init_from_target()
    draft = draft.to(dist.device).attach(target)
    num_params = sum(p.numel() for p in draft.parameters())
    log(f"{m.algo} draft: {num_params / 1e6:.2f}M trainable parameters, vocab {dcfg.out_vocab_size}, "
        f"layers {dcfg.num_layers}, γ {dcfg.block_size}, features {list(dcfg.feature_layers)}")

    if cfg.cache_dir is not None:
        source = OfflineFeatures(cfg.cache_dir, target, dcfg.feature_layers)
        if not source.is_complete(sequences):
            size = estimate_cache_bytes(stats.num_tokens, dcfg.hidden_size, len(dcfg.feature_layers), target.dtype)
            log(f"offline cache: writing ~{size / 2**30:.2f} GiB of target hidden states to {cfg.cache_dir}")
            if dist.is_main:
                with Progress(len(sequences), "cache", enabled=show_progress) as p:
                    source.build(sequences, on_sequence=lambda n: p.advance(1, tokens=n))
            dist.barrier()
    else:
        source = OnlineFeatures(target, dcfg.feature_layers)

    anchor_gen = torch.Generator().manual_seed(cfg.seed * 7919 + dist.rank)
    objective = DraftObjective(draft, target, cfg.data.num_anchors, anchor_gen)
    order = SequenceOrder(num_train, cfg.data.batch_size, cfg.seed, dist.rank, dist.world_size)
    step, tokens_seen = 0, 0
    state = None
    if resume:
        ckpt = latest_checkpoint(out)
        if ckpt is None:
            log(f"--resume: no checkpoint under {out / 'checkpoints'}; starting from scratch")
        else:
            state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
            draft.load_state_dict(state["model"])  # whole weights, before FSDP shards them

    parallel = Parallel(objective, dist.world_size, cfg.dist.fsdp)
    # built after sharding: under FSDP the optimizer steps this rank's shards
    optimizer = torch.optim.AdamW(draft.parameters(), lr=cfg.optim.lr, betas=cfg.optim.betas,
                                  weight_decay=cfg.optim.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
    if state is not None:
        parallel.load_optimizer_state(optimizer, state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        order.load_state(state["order"][dist.rank] if dist.rank < len(state["order"]) else state["order"][0])
        anchor_gen.set_state(state["anchor_rng"][dist.rank] if dist.rank < len(state["anchor_rng"])
                             else state["anchor_rng"][0])
        torch.set_rng_state(state["torch_rng"])
        step, tokens_seen = state["step"], state["tokens_seen"]
        log(f"resumed from {ckpt} at step {step}")

    use_bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and dist.device.startswith("cuda"))

    def gather(values: list) -> list:
        if dist.world_size == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64)
        torch.distributed.all_reduce(t)
        return (t / dist.world_size).tolist()

    saved_step = [step]  # a resumed run starts at a saved step

    def whole_draft():
        """The draft with whole weights: itself, or under FSDP an unsharded twin on rank 0 (None elsewhere)."""
        if not parallel.fsdp:
            return draft
        state = parallel.full_state(draft)
        if not dist.is_main:
            return None
        with torch.random.fork_rng(devices=[]):  # the twin's throwaway init must not move training's RNG
            twin = build_draft(dcfg)
        if dcfg.draft_vocab_size:
            twin.set_vocab(draft.d2t.cpu())
        twin.load_state_dict(state)
        return twin.to(dist.device).attach(target)

    def save_checkpoint() -> None:
        saved_step[0] = step
        orders = [None] * dist.world_size
        rngs = [None] * dist.world_size
        if dist.world_size > 1:
            torch.distributed.all_gather_object(orders, order.state())
            torch.distributed.all_gather_object(rngs, anchor_gen.get_state())
        else:
            orders, rngs = [order.state()], [anchor_gen.get_state()]
        optimizer_state = parallel.optimizer_state(optimizer)  # collective under FSDP
        whole = whole_draft()  # collective under FSDP
        if not dist.is_main:
            return
        path = out / "checkpoints" / f"step_{step:07d}"
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        save_draft(whole, tmp)
        torch.save({"model": whole.state_dict(), "optimizer": optimizer_state,
                    "scheduler": scheduler.state_dict(), "order": orders, "anchor_rng": rngs,
                    "torch_rng": torch.get_rng_state(), "step": step, "tokens_seen": tokens_seen,
                    "config": cfg.model_dump(mode="json")}, tmp / "trainer_state.pt")
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)
        for old in sorted((out / "checkpoints").glob("step_*"))[: -cfg.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)

    if dist.is_main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "train_config.json").write_text(json.dumps(cfg.model_dump(mode="json"), indent=2))
    log_file = (out / "train_log.jsonl").open("a") if dist.is_main else None
    start = time.perf_counter()
    start_tokens = tokens_seen
    last_metrics: dict = {}
    stopped = "max_steps"
    with Progress(cfg.optim.max_steps, f"train {m.algo}", enabled=show_progress and dist.is_main) as progress:
        progress.resume_from(step)
        while step < cfg.optim.max_steps:
            if stop_at_step is not None and step >= stop_at_step:
                stopped = "interrupted"
                break
            if cfg.optim.max_minutes and time.perf_counter() - start > cfg.optim.max_minutes * 60:
                stopped = "time budget"
                break
            optimizer.zero_grad(set_to_none=True)
            losses, micro_tokens, metric_sums = [], 0, {}
            for micro in range(cfg.optim.grad_accum):
                idx = order.next_batch()
                tokens, mask = collate([sequences[i] for i in idx])
                features, final = source(idx, tokens)
                tokens, mask = tokens.to(dist.device), mask.to(dist.device)
                sync = micro == cfg.optim.grad_accum - 1 or dist.world_size == 1
                with parallel.sync_gradients(sync), torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_bf16):
                    loss, metrics = parallel(features.float() if not use_bf16 else features, final, tokens, mask)
                    (loss / cfg.optim.grad_accum).backward()
                losses.append(float(loss.detach()))
                micro_tokens += int(tokens.numel())
                for k, v in metrics.items():
                    metric_sums[k] = metric_sums.get(k, 0.0) + v / cfg.optim.grad_accum
            if cfg.optim.clip_norm:  # FSDP's sharded gradients included: the norm is over whole tensors
                torch.nn.utils.clip_grad_norm_(draft.parameters(), cfg.optim.clip_norm)
            optimizer.step()
            scheduler.step()
            step += 1
            tokens_seen += micro_tokens * dist.world_size
            loss_value, *rest = gather([sum(losses) / len(losses), *metric_sums.values()])
            last_metrics = {"loss": loss_value, **dict(zip(metric_sums, rest))}
            progress.advance(1, tokens=micro_tokens * dist.world_size, loss=round(loss_value, 4),
                             **{k: round(v, 3) for k, v in last_metrics.items() if k in ("acc0", "tau")})
            if log_file is not None:
                log_file.write(json.dumps({"step": step, "lr": scheduler.get_last_lr()[0], "tokens": tokens_seen,
                                           "seconds": round(time.perf_counter() - start, 2), **last_metrics}) + "\n")
                log_file.flush()
            if cfg.save_every and step % cfg.save_every == 0:
                save_checkpoint()
    elapsed = time.perf_counter() - start
    if saved_step[0] != step:
        save_checkpoint()
    summary = {"algo": m.algo, "steps": step, "stopped": stopped, "tokens_seen": tokens_seen,
               "tokens_per_second": round((tokens_seen - start_tokens) / max(elapsed, 1e-9), 1),
               "seconds": round(elapsed, 1), "peak_rss_bytes": peak_rss_bytes(), "num_params": num_params,
               "world_size": dist.world_size, "last": last_metrics, "num_sequences": len(sequences),
               "num_calibration_sequences": num_calibration, "num_tokens": stats.num_tokens}
    whole = whole_draft() if stopped != "interrupted" else None
    if dist.is_main:
        if whole is not None:
            if num_calibration:
                from training.calibration import calibrate_confidence

                temps, summary["calibration"] = calibrate_confidence(
                    whole, target, source, sequences, list(range(num_train, len(sequences))),
                    cfg.data.num_anchors, cfg.seed)
                whole.cfg.confidence_temperature = tuple(temps)
                log(f"confidence calibrated on {num_calibration} held-out sequences: per-slot T {temps}")
            save_draft(whole, out, storage_dtype=cfg.save_dtype)
        (out / "train_summary.json").write_text(json.dumps(summary, indent=2))
        log_file.close()
    dist.barrier()
    return summary


def run_train_cli(args, parser) -> int:
    from pydantic import ValidationError

    from training.config import load_config

    flags = {"model.algo": args.algo, "target.name": args.target,
             "data.paths": [str(p) for p in args.data] if args.data else None,
             "output_dir": str(args.out) if args.out else None,
             "cache_dir": str(args.cache_dir) if args.cache_dir else None,
             "init_from": str(args.init_from) if args.init_from else None}
    try:
        cfg = load_config(args.config, flags, args.overrides)
    except ValidationError as exc:
        parser.error(f"invalid training config:\n{exc}")
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    rank0 = int(os.environ.get("RANK", "0")) == 0
    if rank0:
        print(json.dumps(cfg.model_dump(mode="json"), indent=2), file=sys.stderr)
    if args.plan:
        return 0
    if not cfg.data.paths:
        parser.error("no training data: pass --data FILE.jsonl or data.paths=[...]")

    def log(line: str) -> None:
        if rank0:
            print(line, file=sys.stderr, flush=True)

    try:
        summary = train(cfg, resume=args.resume, log=log)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if rank0:
        gib = summary["peak_rss_bytes"] / 2**30
        log(f"done: {summary['steps']} steps ({summary['stopped']}), {summary['tokens_per_second']:.0f} tok/s, "
            f"peak RSS {gib:.2f} GiB, last {json.dumps({k: round(v, 4) for k, v in summary['last'].items()})}")
        print(json.dumps(summary))
    return 0
