"""The training loop shared by every draft algorithm: frozen target → features (+ labels) → draft loss → AdamW.

What is the algorithm's own (its module, config class, objective and any post-training calibration) comes from its
record, `resolve_algorithm(cfg.model.algo)` (deepspec/algorithms); nothing here names an algorithm.

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
import signal
import sys
import time
from pathlib import Path

import torch
from torch import nn

from deepspec.algorithms import load_part, resolve_algorithm
from training.config import TrainConfig
from training.data import DataStats, SequenceOrder, build_draft_vocab, collate, load_sequences
from training.parallel import Parallel


def autocast_bf16(precision: str, device: str) -> bool:
    """Whether training runs under bf16 autocast: as asked, or for `auto` on a GPU and on a CPU with native bf16
    matmuls (AVX512-BF16 or AMX), where a step costs about half of fp32's for the same loss (training/DESIGN.md);
    fp32 on other CPUs, which emulate bf16 and run it slower. The loss's target distributions stay fp32 either way."""
    if precision != "auto":
        return precision == "bf16"
    if device.startswith("cuda"):
        return True
    from deepspec.models.step_curve import cpu_flags

    flags = cpu_flags().split()
    return "avx512_bf16" in flags or "amx_tile" in flags


class DraftObjective(nn.Module):
    """draft + its algorithm's objective (training/losses.py `Objective`) as one module, so DDP/FSDP see a single
    forward per micro-batch."""

    def __init__(self, draft, target, num_anchors: int, anchor_generator: torch.Generator, loss_fn):
        super().__init__()
        self.draft = draft
        self.target = target  # a dataclass, not a module: its frozen weights stay out of the optimizer and DDP
        self.num_anchors = num_anchors
        self.anchor_generator = anchor_generator
        self.loss_fn = loss_fn

    def forward(self, features, labels, tokens, loss_mask):
        """labels: the target's final hidden state [B, T, H] (regen) or its SoftLabels [B, T, k] (target)."""
        loss, metrics = self.loss_fn(
            self.draft, self.target, features, labels, tokens, loss_mask, self.anchor_generator, self.num_anchors
        )
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
            backend = (
                cfg.dist.backend if cfg.dist.backend != "auto" else ("nccl" if device.startswith("cuda") else "gloo")
            )
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

    if cfg.init_from is None:
        raise ValueError("initial_draft needs init_from: the draft directory to fine-tune")
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


class Trainer:
    """One training run, step by step: `run()` = load data → build the draft → feature source → (resume) →
    optimizer → the step loop → the final draft and summary. State lives on the instance, so every step is a
    method that reads and writes it in the open.

    `stop_at_step` ends the run early as if interrupted (tests of --resume); `log(str)` receives status lines."""

    def __init__(self, cfg: TrainConfig, *, show_progress: bool = True, log=None):
        self.cfg, self.show_progress = cfg, show_progress
        self.algorithm = resolve_algorithm(cfg.model.algo)
        self.log = log or (lambda s: None)
        self.dist = _Dist(cfg)
        self.out = Path(cfg.output_dir)
        self.step, self.tokens_seen = 0, 0
        self.saved_step = 0  # the step of the newest checkpoint on disk (a resumed run starts at one)
        self.last_metrics: dict = {}
        #: set (e.g. by a SIGTERM handler) to end the run after the current step, checkpoint saved
        self.stop_requested = False

    # ---- the run ---------------------------------------------------------------------------------------------
    def run(self, *, resume: bool = False, stop_at_step: int | None = None) -> dict:
        self.load_data()
        self.build_draft()
        self.build_feature_source()
        state = self.read_checkpoint() if resume else None
        self.build_optimizer()
        if state is not None:
            self.restore(state)
        self.write_run_config()
        start = time.perf_counter()
        start_tokens = self.tokens_seen
        stopped = self.loop(start, stop_at_step)
        elapsed = time.perf_counter() - start
        if self.saved_step != self.step:
            self.save_checkpoint()
        return self.finish(stopped, elapsed, self.tokens_seen - start_tokens)

    # ---- setup -----------------------------------------------------------------------------------------------
    def load_data(self) -> None:
        from deepspec.models import load_target

        cfg = self.cfg
        self.target = load_target(
            cfg.target.name, dtype=cfg.target.dtype, device=self.dist.device, chat_template=cfg.target.chat_template
        )
        self.stats = DataStats()
        self.sequences = load_sequences(
            cfg.data.paths, self.target, cfg.data.max_len, self.stats, text_rows=cfg.data.labels == "target"
        )
        if cfg.data.max_sequences is not None and len(self.sequences) > cfg.data.max_sequences:
            self.sequences = self.sequences[: cfg.data.max_sequences]
            self.stats.num_tokens = sum(len(s.input_ids) for s in self.sequences)
            self.stats.num_loss_tokens = sum(sum(s.loss_mask) for s in self.sequences)
        if self.stats.num_malformed:
            self.log(f"skipped {self.stats.num_malformed} malformed rows (first: {self.stats.problems[0]})")
        self.log(
            f"{len(self.sequences)} sequences, {self.stats.num_tokens:,} tokens "
            f"({self.stats.num_loss_tokens:,} trained on), labels: {cfg.data.labels}"
        )
        # an algorithm that calibrates (DSpark's confidence head) holds out the last rows: text it never trained on
        self.num_calibration = (
            min(cfg.model.calibration_sequences, len(self.sequences) // 10)
            if self.algorithm.calibrate is not None
            else 0
        )
        self.num_train = len(self.sequences) - self.num_calibration

    def build_draft(self) -> None:
        """A fresh draft sized from the target (with its reduced vocabulary), or the `init_from` one."""
        from deepspec.models.drafts import DraftConfig, build_draft

        cfg, m, target = self.cfg, self.cfg.model, self.target
        torch.manual_seed(cfg.seed)
        if cfg.init_from is not None:
            draft = initial_draft(cfg, target).to(self.dist.device).attach(target)
            self.log(f"starting from the weights and vocabulary of {cfg.init_from}")
        else:
            dcfg = DraftConfig.for_target(
                target,
                m.algo,
                num_layers=m.num_layers,
                block_size=m.block_size,
                draft_vocab_size=min(m.draft_vocab_size, target.vocab_size),
                markov_rank=m.markov_rank,
                feature_layers=tuple(m.feature_layers) if m.feature_layers else None,
                layout=m.layout,
            )
            draft = build_draft(dcfg)
            if dcfg.draft_vocab_size:
                draft.set_vocab(
                    build_draft_vocab(
                        self.sequences[: self.num_train], dcfg.draft_vocab_size, target.vocab_size, target.eos_token_ids
                    )
                )
            draft = draft.to(self.dist.device).attach(target)
            draft.init_from_target()
        self.draft, self.dcfg = draft, draft.cfg
        self.num_params = sum(p.numel() for p in draft.parameters())
        self.log(
            f"{m.algo} draft: {self.num_params / 1e6:.2f}M trainable parameters, vocab {self.dcfg.out_vocab_size}, "
            f"layers {self.dcfg.num_layers}, γ {self.dcfg.block_size}, features {list(self.dcfg.feature_layers)}"
        )

    def build_feature_source(self) -> None:
        """What each batch reads from the frozen target: online (in the loop) or the offline cache; with
        labels=target the second output is SoftLabels instead of the final hidden state."""
        from training.distill import DistillFeatures
        from training.features import OfflineFeatures, OnlineFeatures, estimate_cache_bytes
        from training.progress import Progress

        cfg, dcfg, target = self.cfg, self.dcfg, self.target
        distill = (
            DistillFeatures(target, dcfg.feature_layers, self.draft.d2t, cfg.data.label_top_k)
            if cfg.data.labels == "target"
            else None
        )
        writer = None
        if cfg.features_from == "native":
            if distill is not None:
                raise ValueError(
                    "features_from native computes features and final hidden states, not soft labels: "
                    "use it with data.labels regen, or features_from target with labels target"
                )
            from deepspec.models.native import load_native_target

            writer = load_native_target(cfg.target.name, num_threads=torch.get_num_threads())
        if cfg.cache_dir is None:
            self.source = distill or OnlineFeatures(writer or target, dcfg.feature_layers)
            return
        self.source = OfflineFeatures(cfg.cache_dir, target, dcfg.feature_layers, distill=distill, writer=writer)
        if not self.source.is_complete(self.sequences):
            top_k = (cfg.data.label_top_k or dcfg.out_vocab_size) if distill is not None else None
            size = estimate_cache_bytes(
                self.stats.num_tokens, dcfg.hidden_size, len(dcfg.feature_layers), target.dtype, label_top_k=top_k
            )
            what = "target hidden states" if distill is None else f"target features and top-{top_k} labels"
            self.log(f"offline cache: writing ~{size / 2**30:.2f} GiB of {what} to {cfg.cache_dir}")
            if self.dist.is_main:
                with Progress(len(self.sequences), "cache", enabled=self.show_progress) as p:
                    self.source.build(self.sequences, on_sequence=lambda n: p.advance(1, tokens=n))
            self.dist.barrier()

    def read_checkpoint(self) -> dict | None:
        """The newest checkpoint's trainer state, its whole weights loaded into the draft (before FSDP shards
        them); None (and a fresh start) when there is none."""
        ckpt = latest_checkpoint(self.out)
        if ckpt is None:
            self.log(f"--resume: no checkpoint under {self.out / 'checkpoints'}; starting from scratch")
            return None
        state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
        self.draft.load_state_dict(state["model"])
        self.log(f"resuming from {ckpt}")
        return state

    def build_optimizer(self) -> None:
        cfg = self.cfg
        self.anchor_gen = torch.Generator().manual_seed(cfg.seed * 7919 + self.dist.rank)
        self.objective = DraftObjective(
            self.draft, self.target, cfg.data.num_anchors, self.anchor_gen, load_part(self.algorithm.loss)
        )
        self.order = SequenceOrder(self.num_train, cfg.data.batch_size, cfg.seed, self.dist.rank, self.dist.world_size)
        self.parallel = Parallel(self.objective, self.dist.world_size, cfg.dist.fsdp)
        # built after sharding: under FSDP the optimizer steps this rank's shards
        self.optimizer = torch.optim.AdamW(
            self.draft.parameters(), lr=cfg.optim.lr, betas=cfg.optim.betas, weight_decay=cfg.optim.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg))
        self.use_bf16 = autocast_bf16(cfg.precision, self.dist.device)

    def restore(self, state: dict) -> None:
        """Optimizer, scheduler, data position and RNGs of a checkpoint (each rank its own, or rank 0's)."""
        rank = self.dist.rank
        self.parallel.load_optimizer_state(self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.order.load_state(state["order"][rank] if rank < len(state["order"]) else state["order"][0])
        rngs = state["anchor_rng"]
        self.anchor_gen.set_state(rngs[rank] if rank < len(rngs) else rngs[0])
        torch.set_rng_state(state["torch_rng"])
        self.step, self.tokens_seen = state["step"], state["tokens_seen"]
        self.saved_step = self.step
        self.log(f"resumed at step {self.step}")

    def write_run_config(self) -> None:
        if self.dist.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "train_config.json").write_text(json.dumps(self.cfg.model_dump(mode="json"), indent=2))

    # ---- training --------------------------------------------------------------------------------------------
    def loop(self, start: float, stop_at_step: int | None) -> str:
        """Optimizer steps until max_steps, the time budget or `stop_at_step`; returns why it stopped."""
        from training.progress import Progress

        cfg = self.cfg
        log_file = (self.out / "train_log.jsonl").open("a") if self.dist.is_main else None
        try:
            with Progress(
                cfg.optim.max_steps, f"train {cfg.model.algo}", enabled=self.show_progress and self.dist.is_main
            ) as progress:
                progress.resume_from(self.step)
                while self.step < cfg.optim.max_steps:
                    if stop_at_step is not None and self.step >= stop_at_step:
                        return "interrupted"
                    if self.stop_requested:
                        return "signal"
                    if cfg.optim.max_minutes and time.perf_counter() - start > cfg.optim.max_minutes * 60:
                        return "time budget"
                    num_tokens = self.train_step()
                    self.report(progress, log_file, num_tokens, time.perf_counter() - start)
                    if cfg.save_every and self.step % cfg.save_every == 0:
                        self.save_checkpoint()
            return "max_steps"
        finally:
            if log_file is not None:
                log_file.close()

    def train_step(self) -> int:
        """One optimizer step over grad_accum micro-batches; sets last_metrics, returns the tokens it read."""
        cfg, dist = self.cfg, self.dist
        accum = cfg.optim.grad_accum
        self.optimizer.zero_grad(set_to_none=True)
        losses, num_tokens, metric_sums = [], 0, {}
        for micro in range(accum):
            idx = self.order.next_batch()
            tokens, mask = collate([self.sequences[i] for i in idx])
            features, labels = self.source(idx, tokens)
            tokens, mask = tokens.to(dist.device), mask.to(dist.device)
            sync = micro == accum - 1 or dist.world_size == 1
            with (
                self.parallel.sync_gradients(sync),
                torch.autocast(torch.device(dist.device).type, dtype=torch.bfloat16, enabled=self.use_bf16),
            ):
                loss, metrics = self.parallel(features if self.use_bf16 else features.float(), labels, tokens, mask)
                (loss / accum).backward()
            losses.append(float(loss.detach()))
            num_tokens += int(tokens.numel())
            for k, v in metrics.items():
                metric_sums[k] = metric_sums.get(k, 0.0) + v / accum
        if cfg.optim.clip_norm:  # FSDP's sharded gradients included: the norm is over whole tensors
            torch.nn.utils.clip_grad_norm_(self.draft.parameters(), cfg.optim.clip_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        self.tokens_seen += num_tokens * dist.world_size
        loss_value, *rest = self.gather([sum(losses) / len(losses), *metric_sums.values()])
        self.last_metrics = {"loss": loss_value, **dict(zip(metric_sums, rest))}
        return num_tokens * dist.world_size

    def gather(self, values: list[float]) -> list[float]:
        """The mean of `values` over ranks."""
        if self.dist.world_size == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64)
        torch.distributed.all_reduce(t)
        return (t / self.dist.world_size).tolist()

    def report(self, progress, log_file, num_tokens: int, seconds: float) -> None:
        metrics = self.last_metrics
        progress.advance(
            1,
            tokens=num_tokens,
            loss=round(metrics["loss"], 4),
            **{k: round(v, 3) for k, v in metrics.items() if k in ("acc0", "tau")},
        )
        if log_file is not None:
            log_file.write(
                json.dumps(
                    {
                        "step": self.step,
                        "lr": self.scheduler.get_last_lr()[0],
                        "tokens": self.tokens_seen,
                        "seconds": round(seconds, 2),
                        **metrics,
                    }
                )
                + "\n"
            )
            log_file.flush()

    # ---- saving ----------------------------------------------------------------------------------------------
    def whole_draft(self):
        """The draft with whole weights: itself, or under FSDP an unsharded twin on rank 0 (None elsewhere).
        Collective under FSDP."""
        from deepspec.models.drafts import build_draft

        if not self.parallel.fsdp:
            return self.draft
        state = self.parallel.full_state(self.draft)
        if not self.dist.is_main:
            return None
        with torch.random.fork_rng(devices=[]):  # the twin's throwaway init must not move training's RNG
            twin = build_draft(self.dcfg)
        if self.dcfg.draft_vocab_size:
            twin.set_vocab(self.draft.d2t.cpu())
        twin.load_state_dict(state)
        return twin.to(self.dist.device).attach(self.target)

    def save_checkpoint(self) -> None:
        """Everything a bit-for-bit resume needs, under checkpoints/step_N (written aside, then renamed)."""
        from deepspec.models.drafts import save_draft

        dist, cfg = self.dist, self.cfg
        self.saved_step = self.step
        if dist.world_size > 1:
            orders, rngs = [None] * dist.world_size, [None] * dist.world_size
            torch.distributed.all_gather_object(orders, self.order.state())
            torch.distributed.all_gather_object(rngs, self.anchor_gen.get_state())
        else:
            orders, rngs = [self.order.state()], [self.anchor_gen.get_state()]
        optimizer_state = self.parallel.optimizer_state(self.optimizer)  # collective under FSDP
        whole = self.whole_draft()  # collective under FSDP
        if not dist.is_main:
            return
        assert whole is not None  # the main rank holds the whole draft
        path = self.out / "checkpoints" / f"step_{self.step:07d}"
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        save_draft(whole, tmp)
        torch.save(
            {
                "model": whole.state_dict(),
                "optimizer": optimizer_state,
                "scheduler": self.scheduler.state_dict(),
                "order": orders,
                "anchor_rng": rngs,
                "torch_rng": torch.get_rng_state(),
                "step": self.step,
                "tokens_seen": self.tokens_seen,
                "config": cfg.model_dump(mode="json"),
            },
            tmp / "trainer_state.pt",
        )
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)
        for old in sorted((self.out / "checkpoints").glob("step_*"))[: -cfg.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)

    def finish(self, stopped: str, elapsed: float, new_tokens: int) -> dict:
        """The summary; unless interrupted, the final draft (calibrated first, for DSpark) in output_dir."""
        from deepspec.models.drafts import save_draft

        cfg = self.cfg
        summary = {
            "algo": cfg.model.algo,
            "labels": cfg.data.labels,
            "steps": self.step,
            "stopped": stopped,
            "tokens_seen": self.tokens_seen,
            "tokens_per_second": round(new_tokens / max(elapsed, 1e-9), 1),
            "seconds": round(elapsed, 1),
            "peak_rss_bytes": peak_rss_bytes(),
            "num_params": self.num_params,
            "world_size": self.dist.world_size,
            "last": self.last_metrics,
            "num_sequences": len(self.sequences),
            "num_calibration_sequences": self.num_calibration,
            "num_tokens": self.stats.num_tokens,
        }
        whole = self.whole_draft() if stopped != "interrupted" else None
        if self.dist.is_main:
            if whole is not None:
                if self.num_calibration:
                    summary["calibration"] = self.calibrate(whole)
                save_draft(whole, self.out, storage_dtype=cfg.save_dtype)
            (self.out / "train_summary.json").write_text(json.dumps(summary, indent=2))
        self.dist.barrier()
        return summary

    def calibrate(self, whole) -> list[dict]:
        """The algorithm's calibration (DSpark: per-slot confidence temperatures) on the held-out rows, written into
        whole.cfg; returns its report."""
        calibrate = load_part(self.algorithm.calibrate)
        report = calibrate(
            whole,
            self.target,
            self.source,
            self.sequences,
            list(range(self.num_train, len(self.sequences))),
            self.cfg.data.num_anchors,
            self.cfg.seed,
        )
        self.log(
            f"{self.cfg.model.algo}: calibrated on {self.num_calibration} held-out sequences (the report is "
            "train_summary.json's 'calibration')"
        )
        return report


def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    show_progress: bool = True,
    stop_at_step: int | None = None,
    log=None,
    stop_on_signals: bool = False,
) -> dict:
    """Train one draft; returns a summary dict (also written to <output_dir>/train_summary.json).

    stop_on_signals: SIGTERM / SIGINT end the run after the current step, checkpoint and final draft saved, so a
    long run stopped at the end of a session resumes with --resume where it stopped."""
    trainer = Trainer(cfg, show_progress=show_progress, log=log)
    if stop_on_signals:
        install_stop_handlers(trainer)
    return trainer.run(resume=resume, stop_at_step=stop_at_step)


def install_stop_handlers(trainer: Trainer) -> None:
    """SIGTERM and SIGINT ask `trainer` to stop after its current optimizer step (a second signal is not
    special: the step finishes, then the checkpoint is written)."""

    def request_stop(signum, frame) -> None:
        trainer.stop_requested = True
        trainer.log(f"signal {signal.Signals(signum).name}: stopping after this step, checkpoint saved")

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, request_stop)


def run_train_cli(args, parser) -> int:
    from pydantic import ValidationError

    from training.config import load_config

    flags = {
        "model.algo": args.algo,
        "target.name": args.target,
        "target.chat_template": args.chat_template,
        "data.paths": [str(p) for p in args.data] if args.data else None,
        "data.labels": args.labels,
        "output_dir": str(args.out) if args.out else None,
        "cache_dir": str(args.cache_dir) if args.cache_dir else None,
        "features_from": args.features_from,
        "init_from": str(args.init_from) if args.init_from else None,
    }
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
    if args.threads is not None:
        if args.threads < 1:
            parser.error("--threads must be >= 1")
        torch.set_num_threads(args.threads)

    def log(line: str) -> None:
        if rank0:
            print(line, file=sys.stderr, flush=True)

    try:
        summary = train(cfg, resume=args.resume, log=log, stop_on_signals=True)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if rank0:
        gib = summary["peak_rss_bytes"] / 2**30
        log(
            f"done: {summary['steps']} steps ({summary['stopped']}), {summary['tokens_per_second']:.0f} tok/s, "
            f"peak RSS {gib:.2f} GiB, last {json.dumps({k: round(v, 4) for k, v in summary['last'].items()})}"
        )
        print(json.dumps(summary))
    return 0
