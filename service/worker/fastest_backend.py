"""`--backend auto` (the worker's default): serve the inference backend that runs fastest on this machine.

Three engines serve the same target on CPU: the PyTorch engine (bf16, the GGUF's own 4-bit weights), ONNX Runtime
on an exported graph (`python -m export --format onnx --quantization auto`: int8 or int4 weights, whichever this
CPU runs faster), and the native CPU decoder (deepspec/models/native: a GGUF Q4_1 target's own 4-bit blocks, else
int8 weights, compiled for this CPU on first use, one call a step). Which one wins depends on the CPU (int8 dot
products, AVX-512), so it is measured, not assumed:

1. On the first start for a (target, draft, settings, machine) the worker exports an ONNX bundle into the cache
   (`~/.cache/deepspec/bundles/<key>/onnx`, a progress bar on a terminal; ~10-60 s for the default target), builds
   the native decoder, and times every engine's verify-step curve (deepspec/models/step_curve.py).
2. Each candidate then decodes the calibration prompts (four training prompts held out of every shipped draft's
   data, export/onnx/decode_rate.py) with its draft, as the worker would serve it, and the fastest is served. The
   modelled throughput (the curve at the draft's measured acceptance length, a neural draft's own round cost on
   each engine included: its PyTorch forward beside the PyTorch and native targets, its ONNX graphs beside the
   export, timed at batch 1 by the engine's own probe, deepspec/decoding/draft_time.py) is recorded beside the
   measured rates and decides only where there are no calibration prompts (a package installed without
   datasets/). Why measured: step curves are fastest-of-15 single passes, which miss each engine's own overhead
   per token; the model put ONNX int4 ahead of the native decoder for target-only decoding, which then served 142
   against 227 tok/s at concurrency 8. The choice, the reason, every curve, rate and draft cost go into `choice.json`
   beside the export. Later starts read it and start in seconds, unless it was measured beside busy neighbours
   (other processes held a quarter of the CPU or more): such a choice is provisional and measured again at the
   next starts, up to MAX_BUSY_ATTEMPTS times; `python -m service worker --help` prints it. An
   entry made by an older release for the same settings is deleted when its successor is created (`key.json` says
   what each entry was made for).

`--quantization X` (other than auto) narrows the candidates to the backends that honour X (deepspec/models/backends.py
`weight_formats`), each loaded in it: `gguf` leaves the PyTorch decoder alone, served without measuring; `int8` and
`int4` the ONNX export (made in X) and the native decoder, measured as above; `none` the PyTorch decoder and the
fp32 export. The cache key holds X, so each format's choice is cached apart.

`--backend pytorch`, `--backend onnx` or `--backend native` skips the measurement. Auto leaves out, without measuring,
an engine that cannot run: ONNX on a CUDA device, without onnxruntime, for a target its graph does not describe, or
when the export fails; native on a CUDA device or without a C compiler (each logged; naming the engine raises
instead). A `--bundle-dir` is served as exported.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

from deepspec.models.backends import (
    AUTO,
    NATIVE,
    ONNX,
    PYTORCH,
    backend_choices,
    backends_honouring,
    resolve_backend,
)
from deepspec.neighbours import NeighbourShare

if TYPE_CHECKING:
    from deepspec.models import Target
    from deepspec.models.backends import InferenceBackend

logger = logging.getLogger(__name__)

#: the worker's --backend choices: the registered backends (deepspec/models/backends.py), then auto
BACKENDS: tuple[str, ...] = backend_choices()
CHOICE_FILE = "choice.json"
#: bumped when the choice's rule or the cache layout changes: older records are then measured again (4: a neural
#: draft's own round cost, timed on each engine, is added to its verify passes; scored free, a DSpark draft made an
#: AMX Xeon pick int8, which served 0.91-1.01x of int8 target-only, where int4 + DSpark served 1.09-1.27x; 5: a
#: quantized export's neural draft graphs are int8, their round 2.3x cheaper, and `--quantization auto` keeps the
#: format that decodes calibration prompts fastest, measured (export/onnx/decode_rate.py): the export is redone;
#: 6: the int8 graph quantizes activations per row (export/onnx/graph.py int8_linear), an older int8 export rounds a
#: verify pass differently from its one-token steps; and ONNX Runtime's threads spin within a run, which makes its
#: steps 20-40% cheaper: the curves are timed again; 7: the native CPU decoder is a candidate, and each candidate's
#: decode of the calibration prompts decides, the model only without them: the model had ONNX int4 (160 modelled
#: tok/s) over native (156) for target-only decoding, which served 142 against native's 227 at concurrency 8; 8: the
#: native decoder runs a GGUF Q4_1 target's layers on their own 4-bit blocks, its steps 10-20% cheaper; 9: its KV
#: cache holds float16 and its chain attention runs in registers, 8-row steps up to 1.5x cheaper at long contexts)
CHOICE_VERSION = 9
#: busy-neighbour measurements (deepspec/neighbours.py) a choice is retaken for before the last one is kept: a
#: backend measured beside a test suite was ONNX int8 at 74 against the native decoder's 69 tok/s, the native
#: decoder's threads the ones a neighbour deschedules; on a machine that is never quiet the choice settles anyway
MAX_BUSY_ATTEMPTS = 3


@dataclass(frozen=True)
class BackendChoice:
    #: a backend's name (deepspec/models/backends.py), or "bundle" (a --bundle-dir, served as its manifest says)
    backend: str
    #: why, in one line (logged, printed by --help)
    reason: str
    #: the ONNX bundle to serve (backend "onnx"), else None
    bundle_dir: Path | None = None
    #: what choice.json holds (curves, scores), {} when nothing was measured
    record: dict = field(default_factory=dict)

    def worker_fields(self) -> dict[str, str]:
        """The WorkerSettings fields the chosen backend replaces (none for the PyTorch decoder)."""
        if self.bundle_dir is None:
            return {}
        from service.worker.bundle import read_bundle

        return read_bundle(self.bundle_dir).worker_fields()


def choose_backend(settings) -> BackendChoice:
    """The backend these worker settings run: named by --backend, the one backend that honours --quantization, or
    measured among those that do (all for `--quantization auto`) and cached (module docstring)."""
    if settings.bundle_dir is not None:
        return BackendChoice("bundle", f"as exported in {settings.bundle_dir}")
    if settings.target == "stub":
        return BackendChoice(PYTORCH, "the stub target")
    if settings.backend != AUTO:
        return _named_choice(settings, settings.backend, f"--backend {settings.backend}")
    honouring = backends_honouring(settings.quantization)
    if len(honouring) == 1:
        return _named_choice(settings, honouring[0], _sole_reason(settings.quantization))
    blockers = {name: _blocker(settings, name) for name in honouring}
    runnable = [name for name in honouring if blockers[name] is None]
    why_not = "; ".join(f"{name}: {reason}" for name, reason in blockers.items() if reason)
    if len(runnable) < 2:
        weights = "" if settings.quantization == AUTO else f" that honour --quantization {settings.quantization}"
        if not runnable:
            raise ValueError(f"none of the backends{weights} can run here ({why_not})")
        return _named_choice(settings, runnable[0], f"the other backends{weights} cannot run here ({why_not})")
    return _measured_choice(settings, runnable)


def _sole_reason(weights: str) -> str:
    return f"--quantization {weights}: the only backend that honours it, served without measuring"


def _blocker(settings, backend: str) -> str | None:
    """Why `backend` cannot serve these settings, or None (the native decoder is built here if it is not built
    yet; the PyTorch decoder is assumed to run anywhere)."""
    if backend == PYTORCH:
        return None
    return onnx_blocker(settings) if backend == ONNX else resolve_backend(backend).unavailable(settings.device)


def _named_choice(settings, backend: str, why: str) -> BackendChoice:
    """`backend`, the one to serve for the reason `why`, measuring nothing: ValueError saying why it cannot run here;
    the ONNX backend's bundle is exported into the cache on the first start."""
    if backend == PYTORCH:
        return BackendChoice(PYTORCH, why)
    if reason := _blocker(settings, backend):
        raise ValueError(f"{why}: {reason}")
    if backend != ONNX:
        return BackendChoice(backend, why)
    with _cache_entry(settings) as root:
        return BackendChoice(ONNX, why, ensure_onnx_export(settings, root / "onnx"))


def _measured_choice(settings, runnable: list[str]) -> BackendChoice:
    """The fastest of the `runnable` backends (two or more), measured on the first start and cached; where the ONNX
    export or the measurement fails, the PyTorch decoder (or, where the weight format rules it out, the next
    backend that honours it) serves instead."""
    others = [name for name in runnable if name != ONNX]
    try:
        with _cache_entry(settings) as root:
            onnx_dir = None
            if ONNX in runnable:
                try:
                    onnx_dir = ensure_onnx_export(settings, root / "onnx")
                except (RuntimeError, OSError) as e:
                    if len(others) < 2:  # one backend left: the fallback below serves it, saying why
                        raise
                    logger.warning("the ONNX engine could not be prepared (%s): weighing the others", e)
            native, pytorch = NATIVE in runnable, PYTORCH in runnable
            return cached_choice(root, onnx_dir, native, pytorch) or measure_choice(settings, root, onnx_dir, native)
    except (RuntimeError, OSError, ValueError) as e:  # an export or a measurement that failed (a broken draft, ...)
        if not others:
            raise
        logger.warning("serving the %s backend: the other backends could not be prepared (%s)", others[0], e)
        return BackendChoice(others[0], f"the other engines could not be prepared ({e})")


@contextlib.contextmanager
def _cache_entry(settings):
    """The settings' cache folder (bundle_cache_dir), created with its key.json on first use (pruning the entries an
    upgrade superseded), locked while the export and the measurement run: two workers starting together on one
    machine export once."""
    root = bundle_cache_dir(settings)
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root):
        if not (root / "key.json").is_file():  # a new entry: the ones an upgrade superseded go
            key = cache_key(settings)
            (root / "key.json").write_text(json.dumps(key, indent=2) + "\n")
            for old in prune_superseded(root, key):
                logger.info("removed the superseded bundle cache %s", old)
        yield root


@contextlib.contextmanager
def _locked(root: Path):
    """An exclusive lock on `root/.lock` (fcntl), held while the export and the measurement run."""
    import fcntl

    with open(root / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def onnx_blocker(settings) -> str | None:
    """Why these settings cannot run on the ONNX engine, or None: the backend's own check, then whether the export's
    graph describes the target."""
    if reason := resolve_backend(ONNX).unavailable(settings.device):
        return reason
    from export.api import onnx_unsupported_reason

    return onnx_unsupported_reason(settings.target)


def bundle_cache_dir(settings) -> Path:
    """`<cache>/bundles/<target>-<draft>-<digest of cache_key>`: one folder per target, draft, the settings the
    export depends on, machine and library versions (a cache made on another CPU, or by another release, is not
    reused; `<cache>/engines/`, where releases before the bundle vocabulary kept theirs, is never read)."""
    from deepspec.paths import cache_dir

    key = cache_key(settings)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return cache_dir() / "bundles" / f"{Path(key['target']).name}-{Path(key['draft']).name}-{digest}"


#: the parts of a cache key that an upgrade changes: an entry differing from a new one only there is superseded
_RELEASE_FIELDS = ("versions", "rule")


def cache_key(settings) -> dict:
    """What an engine choice depends on (written to key.json beside it)."""
    from importlib import metadata

    from deepspec.models.step_curve import machine_key

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "none"

    return {
        "target": _absolute(settings.target),
        "draft": _absolute(settings.draft),
        "chat_template": _absolute(settings.chat_template or ""),
        "dtype": settings.dtype,
        "quantization": settings.quantization,
        "depth": settings.num_speculative_tokens,
        "machine": machine_key(),
        "versions": {n: version(n) for n in ("deepspec", "torch", "onnxruntime")},
        "rule": CHOICE_VERSION,
    }


def prune_superseded(root: Path, key: dict) -> list[Path]:
    """Delete the cache entries an upgrade left behind: siblings of `root` whose key.json equals `key` but for the
    library versions and the rule (each holds a ~250 MB export nothing will read again); → the deleted folders."""
    import shutil

    def settings_part(k: dict) -> dict:
        return {f: v for f, v in k.items() if f not in _RELEASE_FIELDS}

    removed = []
    for sibling in root.parent.iterdir():
        if sibling == root or not sibling.is_dir():
            continue
        try:
            other = json.loads((sibling / "key.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(other, dict) and settings_part(other) == settings_part(key):
            shutil.rmtree(sibling, ignore_errors=True)
            removed.append(sibling)
    return removed


def _absolute(spec: str) -> str:
    """A path spec made absolute (two spellings of one folder share a cache entry); aliases and keywords as given."""
    return str(Path(spec).resolve()) if spec and Path(spec).exists() else spec


def ensure_onnx_export(settings, out: Path) -> Path:
    """The ONNX engine for these settings at `out`, exported on the first call (export's own write-then-rename: an
    interrupted export leaves nothing behind, and the next start exports again). RuntimeError when it fails."""
    if (out / "manifest.json").is_file():
        return out
    from export.api import ExportError, ExportRequest, export_bundle

    out.parent.mkdir(parents=True, exist_ok=True)
    logger.info("exporting the ONNX engine for %s into %s (first start on this machine)", settings.target, out)
    try:
        export_bundle(
            ExportRequest(
                format="onnx",
                out=out,
                target=settings.target,
                draft=settings.draft,
                chat_template=settings.chat_template,
                quantization=settings.quantization,
                force=True,
            )
        )
    except ExportError as e:
        raise RuntimeError(f"the ONNX export for {settings.target} failed: {e}") from e
    return out


def cached_choice(root: Path, onnx_dir: Path | None, native: bool = True, pytorch: bool = True) -> BackendChoice | None:
    """The choice recorded by an earlier start, or None when there is none, it is unreadable, or the engine it chose
    cannot run now (`native`, `pytorch`: whether those are candidates; the ONNX engine is where `onnx_dir` is)."""
    try:
        record = json.loads((root / CHOICE_FILE).read_text())
        # "engine": the key of records written before the backends had their name
        engine, reason = record.get("backend", record.get("engine")), record["reason"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    runnable = {name for name, runs in ((PYTORCH, pytorch), (ONNX, onnx_dir is not None), (NATIVE, native)) if runs}
    if engine not in runnable or record.get("version") != CHOICE_VERSION:
        return None
    if record.get("provisional") and record.get("attempts", 1) < MAX_BUSY_ATTEMPTS:
        return None  # measured beside busy neighbours: measure again at this start
    return BackendChoice(
        engine,
        f"{reason} (measured {record.get('measured', '?')}, cached in {root})",
        onnx_dir if engine == ONNX else None,
        record,
    )


def _neighbours_record(root: Path, neighbours) -> dict:
    """What choice.json says of the machine the measurement ran on: the other processes' CPU share, and whether it
    made the choice provisional (deepspec/neighbours.py), counting the busy measurements so far."""
    if not neighbours.busy:
        return {"neighbour_share": neighbours.share, "provisional": False}
    try:
        before = json.loads((root / CHOICE_FILE).read_text())
        attempts = before.get("attempts", 1) + 1 if before.get("provisional") else 1
    except (OSError, ValueError, AttributeError):
        attempts = 1
    logger.warning(
        "the backend choice was measured beside busy neighbours (%.0f%% of the CPU): it is provisional "
        "and measured again at the next start (%d of %d)",
        100 * neighbours.share,
        attempts,
        MAX_BUSY_ATTEMPTS,
    )
    return {"neighbour_share": round(neighbours.share, 3), "provisional": True, "attempts": attempts}


def measure_choice(settings, root: Path, onnx_dir: Path | None, native: bool = False) -> BackendChoice:
    """Time each candidate's verify-step curve (the ONNX export's was recorded when it was exported) and score it
    with its draft's round cost on that engine where the draft runs a model (the model); then decode the calibration
    prompts on each as it would serve them (export/onnx/decode_rate.py) and keep the fastest measured, or, without
    calibration prompts, the best modelled. Candidates, each in the settings' weight format: the PyTorch engine where
    it honours that format, the ONNX export when there is one, the native decoder when `native`. Writes
    choice.json."""
    import time

    from deepspec.decoding.verify_budget import modelled_tokens_per_second
    from deepspec.models.step_curve import cpu_flags, curve_record, drafter_acceptance_length
    from export.api import measure_served_rates

    onnx_meta = json.loads((onnx_dir / "onnx.json").read_text()) if onnx_dir is not None else {}
    candidates = _candidates(settings, onnx_dir, onnx_meta, native)
    depth = settings.num_speculative_tokens
    tau = drafter_acceptance_length(
        candidates.draft_dir, onnx_meta.get("draft", {}).get("path") or _drafter_name(settings)
    )
    scores = {
        k: modelled_tokens_per_second(c, tau, depth, candidates.draft_times[k]) for k, c in candidates.curves.items()
    }
    with NeighbourShare() as neighbours:
        measured = measure_served_rates(candidates.served, depth)
    rates = {k: r["tokens_per_second"] for k, r in measured.items()} if measured else scores
    engine = max(rates, key=lambda k: rates[k])
    others = [k for k in rates if k != engine]
    labels, draft_times = candidates.labels, candidates.draft_times
    against = " and ".join(f"{labels[k]}'s {rates[k]:.0f}" for k in others)
    drafting = (
        ""
        if draft_times[engine] is None
        else (
            f", {depth} drafts costing {draft_times[engine].by_width()[depth] * 1e3:.1f} ms a round against "
            + " and ".join(f"{draft_times[k].by_width()[depth] * 1e3:.1f}" for k in others)
        )
    )
    verb = "decoded calibration prompts at" if measured else "models"
    reason = (
        f"{labels[engine]} {verb} {rates[engine]:.0f} tok/s against {against} (draft tau {tau:.2f}, depth "
        f"{depth}{drafting}), on {os.cpu_count()} cores with {cpu_flags()}"
    )
    record = {
        "version": CHOICE_VERSION,
        "backend": engine,
        "reason": reason,
        "measured": time.strftime("%Y-%m-%d %H:%M"),
        "acceptance_length": round(tau, 3),
        "depth": depth,
        "tokens_per_second": {k: round(v, 1) for k, v in scores.items()},
        "decode_rates": measured,
        "step_curves": {
            k: onnx_meta.get("step_curve") if k == ONNX else curve_record(c) for k, c in candidates.curves.items()
        },
        # each engine's batch-1 drafted round by width; null: priced as free (no draft, or a lookup draft)
        "draft_rounds": {k: None if d is None else curve_record(d.by_width()) for k, d in draft_times.items()},
        "onnx_quantization": onnx_meta.get("quantization"),
    }
    record.update(_neighbours_record(root, neighbours))
    (root / CHOICE_FILE).write_text(json.dumps(record, indent=2) + "\n")
    return BackendChoice(engine, reason, onnx_dir if engine == ONNX else None, record)


@dataclass
class _Candidates:
    """Each candidate engine's verify-step curve, its draft's round cost there, its label, and (target, drafter) as
    it would serve them."""

    draft_dir: Path | None
    curves: dict = field(default_factory=dict)
    draft_times: dict = field(default_factory=dict)
    labels: dict = field(default_factory=dict)
    served: dict = field(default_factory=dict)


def load_with(backend: InferenceBackend, spec: str, **options) -> Target:
    """`backend.load(spec, **options)`: every backend's loader returns a Target, which the registry's field
    declares only as `object` (deepspec/models/backends.py InferenceBackend.load)."""
    return cast("Target", backend.load(spec, **options))


def _candidates(settings, onnx_dir: Path | None, onnx_meta: dict, native: bool) -> _Candidates:
    from deepspec.decoding import build_drafter
    from deepspec.decoding.draft_time import measure_draft_time, runs_a_model
    from deepspec.models.step_curve import measure_recorded_curve, recorded_curve
    from export.api import exported_draft_dir, served_drafter

    draft_dir = exported_draft_dir(onnx_dir, onnx_meta) if onnx_dir is not None else _draft_dir(settings.draft)
    out, depth = _Candidates(draft_dir), settings.num_speculative_tokens
    draft = str(draft_dir) if draft_dir is not None else settings.draft

    def add(name: str, target, label: str, curve=None) -> None:
        out.curves[name] = curve or measure_recorded_curve(target)
        out.labels[name] = label
        out.served[name] = (target, served_drafter(target) if name == ONNX else build_drafter(draft, target))
        out.draft_times[name] = draft_time(name)

    def draft_time(name: str):
        """The draft's batch-1 round on candidate `name`, timed on the drafter it would serve with (the engine binds
        it again; the ONNX export's own timing where it recorded one); None without a draft directory or for a
        draft that runs no model."""
        target, drafter = out.served[name]
        if draft_dir is None or not runs_a_model(drafter):
            return None
        exported = _exported_draft_time(onnx_meta, depth) if name == ONNX else None
        return exported or measure_draft_time(target, drafter, depth)

    weights = settings.quantization
    if PYTORCH in backends_honouring(weights):  # int8 / int4 are the ONNX export's and the native decoder's only
        target = load_with(
            resolve_backend(PYTORCH),
            settings.target,
            weights=weights,
            dtype=settings.dtype,
            device=settings.device,
            chat_template=settings.chat_template,
        )
        add(PYTORCH, target, f"PyTorch {'GGUF 4-bit' if target.quantization == 'gguf' else settings.dtype}")
    if onnx_dir is not None and (onnx_curve := recorded_curve(onnx_meta.get("step_curve"))):
        onnx_target = load_with(resolve_backend(ONNX), str(onnx_dir))
        add(ONNX, onnx_target, f"ONNX {onnx_meta.get('quantization', '?')}", onnx_curve)
    if native:
        from deepspec.models.native.target import NativeTarget

        native_target = load_with(
            resolve_backend(NATIVE), settings.target, weights=weights, chat_template=settings.chat_template
        )
        if not isinstance(native_target, NativeTarget):
            raise TypeError(f"the native backend loaded a {type(native_target).__name__}, not a NativeTarget")
        add(NATIVE, native_target, f"native {native_target.quantization} ({native_target.isa})")
    return out


def _draft_dir(draft: str) -> Path | None:
    """The draft directory a worker's --draft names, when there is no ONNX export whose copy of it to read; None
    for a keyword (`auto` included: which shipped draft it means depends on the loaded target)."""
    from deepspec.decoding.registry import drafter_keywords

    return Path(draft) if draft not in drafter_keywords() and Path(draft).is_dir() else None


def _drafter_name(settings) -> str:
    return "" if settings.draft == "none" else settings.draft


def _exported_draft_time(onnx_meta: dict, depth: int):
    """The draft's batch-1 round cost on the exported format as `--quantization auto` timed it (its choice record),
    when that was on this machine and at the depth the worker drafts; None otherwise (then it is timed here)."""
    from deepspec.decoding.verify_budget import DraftTimeModel
    from deepspec.models.step_curve import recorded_times

    candidates = (onnx_meta.get("quantization_choice") or {}).get("candidates") or {}
    # a round may cost 0 ms (a made-up timing) or be timed at one width, unlike a verify-step curve
    by_width = recorded_times((candidates.get(onnx_meta.get("quantization")) or {}).get("draft_round"))
    if by_width is None or depth not in by_width or any(seconds < 0 for seconds in by_width.values()):
        return None
    return DraftTimeModel({(1, width): seconds for width, seconds in by_width.items()})


def describe_cached_choice(settings) -> str | None:
    """One line for --help: the choice recorded for these settings on this machine (or the one backend that honours
    their weight format), or None before the first start (reads choice.json only; measures nothing)."""
    if settings.backend != AUTO or settings.bundle_dir is not None or settings.target == "stub":
        return None
    if len(honouring := backends_honouring(settings.quantization)) == 1:
        return f"{honouring[0]}: {_sole_reason(settings.quantization)}"
    root = bundle_cache_dir(settings)
    choice = cached_choice(root, root / "onnx")
    return f"{choice.backend}: {choice.reason}" if choice else None
