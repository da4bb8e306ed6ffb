"""Ahead-of-time compilation of every Triton kernel to PTX and cubin, without a GPU.

`triton.compile(ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", arch, 32))` runs Triton's
whole pipeline on the CPU (ptxas ships in the triton wheel). A build writes, per kernel variant and arch,
`<kernel>[-<variant>].sm<arch>.ptx` and `.cubin`, plus `index.json`: kernel, variant, arch, entry name (the PTX
`.entry`), signature, constexprs, num_warps and shared memory: what a TensorRT AOT plugin or a CUDA-driver
loader needs to launch it. sm_90 is emitted as sm_90a (runs on Hopper only). The signature's API is that of the
triton version pinned in the `plugins` extra.

Launch contract (all kernels): grid (B, 1, 1) with one program per row (process_logits: B*T; compact_kv:
(B, L*H)), block (32 * num_warps, 1, 1), the arguments in signature order: input pointers, integer scalars, output
pointers, which is the order a TensorRT AOT plugin launches them in.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: vocabulary chunk the AOT kernels stream in; any V works, this only sets the tile
AOT_BLOCK_V = 1024
#: tree sizes (nodes, the root included) the AOT tree kernels are built for: the kernel holds a tree in registers
#: of BLOCK_N lanes, so each size is its own kernel and a plugin takes the smallest that holds its largest tree.
#: The engine drafts `num_speculative_tokens` nodes plus the root: the service allows 32, `training eval
#: --verify-all` more. A larger tree is refused (aot_block), never cut. The JIT path sizes BLOCK_N per call.
AOT_NODE_BLOCKS = (16, 64, 256)
#: draft-slot counts the AOT confidence_truncate is built for (BLOCK_K lanes), chosen and refused the same way
AOT_SLOT_BLOCKS = (16, 64, 256)
#: the survival threshold the index's confidence_truncate is built with (TensorRT passes only integer scalars, so
#: plugins.tensorrt compiles each node's own threshold in)
AOT_THRESHOLD = 0.5
#: the out-of-place compact_kv's tile: positions x head_dim elements (any S and head_dim work)
AOT_BLOCK_S = 16
AOT_BLOCK_D = 64


def aot_block(size: int, blocks: tuple[int, ...], op: str, unit: str) -> int:
    """The smallest of `blocks` that holds `size` lanes (tree nodes, draft slots) of `op`; a larger size raises
    ValueError, since a kernel built for fewer lanes would ignore the rest."""
    fitting = [b for b in blocks if b >= size]
    if not fitting:
        raise ValueError(
            f"{op}: {size} {unit} are more than the {max(blocks)} its ahead-of-time kernels are built "
            f"for (plugins.aot); build the engine's optimization profile for at most {max(blocks)}, "
            "draft fewer speculative tokens, or add a larger block to plugins.aot"
        )
    return min(fitting)


@dataclass(frozen=True)
class KernelSpec:
    kernel: str  # function name in plugins.kernels.chain / tree
    module: str
    variant: str
    signature: dict
    constexprs: dict = field(default_factory=dict)
    num_warps: int = 4

    @property
    def stem(self) -> str:
        return self.kernel + (f"-{self.variant}" if self.variant else "")


def _ptrs(**names) -> dict:
    return {n: f"*{t}" for n, t in names.items()}


#: the modules the kernels live in, and the vocabulary tile every kernel that streams logits is built with
_CHAIN, _TREE = "plugins.kernels.chain", "plugins.kernels.tree"
_BLOCK_V = {"BLOCK_V": AOT_BLOCK_V}
#: what both KV compactions read: the cache, each row's start, its accepted path and the path's length
_KV_PATH_PTRS = _ptrs(cache_ptr="fp32", start_ptr="i64", path_ptr="i64", num_ptr="i64")
#: the sampling parameters and seeds a sampled acceptance kernel reads, after its draft pointers
_SAMPLING_PTRS = _ptrs(q_ptr="fp32", temp_ptr="fp32", topk_ptr="i64", topp_ptr="fp32", seed_ptr="i64")


def kernel_specs() -> list[KernelSpec]:
    """Every kernel variant the build compiles, in index order: the greedy and logits-processing chain kernels, the
    two KV compactions, confidence_truncate per slot block, then for each draft-probability mode (q given, or
    one-hot) rejection sampling and tree acceptance per node block."""
    specs = [_greedy_accept_spec(), _process_logits_spec(), _compact_kv_spec(), _compact_kv_out_spec()]
    specs += [_confidence_truncate_spec(block_k) for block_k in AOT_SLOT_BLOCKS]
    for has_q in (False, True):
        specs.append(_rejection_sample_spec(has_q))
        specs += [_tree_accept_spec(has_q, block_n) for block_n in AOT_NODE_BLOCKS]
    return specs


def _greedy_accept_spec() -> KernelSpec:
    inputs = _ptrs(draft_ptr="i64", num_ptr="i64", logits_ptr="fp32")
    return _vocab_streaming_spec("greedy_accept_kernel", inputs, "K", _ptrs(out_num_ptr="i64", out_next_ptr="i64"))


def _process_logits_spec() -> KernelSpec:
    inputs = _ptrs(logits_ptr="fp32", temp_ptr="fp32", topk_ptr="i64", topp_ptr="fp32")
    return _vocab_streaming_spec("process_logits_kernel", inputs, "T_LEN", _ptrs(out_ptr="fp32"))


def _vocab_streaming_spec(kernel: str, inputs: dict, length: str, outputs: dict) -> KernelSpec:
    """A chain kernel that streams each row's vocabulary in BLOCK_V tiles: its input pointers, the row's length
    (`length`) and V, its output pointers."""
    signature = {**inputs, length: "i32", "V": "i32", **outputs, "BLOCK_V": "constexpr"}
    return KernelSpec(kernel, _CHAIN, "", signature, _BLOCK_V)


def _compact_kv_spec() -> KernelSpec:
    """In place, over a cache's strides."""
    strides = _scalars("i64", "stride_l", "stride_b", "stride_h", "stride_s")
    signature = {**_KV_PATH_PTRS, **_scalars("i32", "H", "N"), **strides, "D": "i32", "BLOCK_D": "constexpr"}
    return KernelSpec("compact_kv_kernel", _TREE, "", signature, {"BLOCK_D": 128})


def _compact_kv_out_spec() -> KernelSpec:
    """Out of place, into a contiguous output (what a TensorRT plugin can write)."""
    signature = {
        **_KV_PATH_PTRS,
        **_scalars("i32", "B", "H", "S", "N", "D"),
        **_ptrs(out_ptr="fp32"),
        **_scalars("constexpr", "BLOCK_S", "BLOCK_D"),
    }
    return KernelSpec("compact_kv_out_kernel", _TREE, "", signature, {"BLOCK_S": AOT_BLOCK_S, "BLOCK_D": AOT_BLOCK_D})


def _scalars(kind: str, *names: str) -> dict:
    """Signature entries of one kind (an integer type, or constexpr), in order."""
    return dict.fromkeys(names, kind)


def _confidence_truncate_spec(block_k: int) -> KernelSpec:
    signature = {
        **_ptrs(conf_ptr="fp32", num_ptr="i64"),
        "K": "i32",
        **_ptrs(out_num_ptr="i64", out_surv_ptr="fp32"),
        "THRESHOLD": "constexpr",
        "BLOCK_K": "constexpr",
    }
    constexprs = {"THRESHOLD": AOT_THRESHOLD, "BLOCK_K": block_k}
    return KernelSpec("confidence_truncate_kernel", _CHAIN, f"k{block_k}", signature, constexprs)


def _rejection_sample_spec(has_q: bool) -> KernelSpec:
    signature = {
        **_ptrs(draft_ptr="i64", num_ptr="i64", logits_ptr="fp32"),
        **_SAMPLING_PTRS,
        "K": "i32",
        "V": "i32",
        **_ptrs(out_num_ptr="i64", out_next_ptr="i64"),
        "HAS_Q": "constexpr",
        "BLOCK_V": "constexpr",
    }
    return KernelSpec("rejection_sample_kernel", _CHAIN, _q_variant(has_q), signature, {"HAS_Q": has_q, **_BLOCK_V})


def _tree_accept_spec(has_q: bool, block_n: int) -> KernelSpec:
    signature = {
        **_ptrs(tokens_ptr="i64", parents_ptr="i64", num_ptr="i64", logits_ptr="fp32"),
        **_SAMPLING_PTRS,
        "N": "i32",
        "V": "i32",
        **_ptrs(out_num_ptr="i64", out_next_ptr="i64", out_path_ptr="i64"),
        "HAS_Q": "constexpr",
        "BLOCK_N": "constexpr",
        "BLOCK_V": "constexpr",
    }
    constexprs = {"HAS_Q": has_q, "BLOCK_N": block_n, **_BLOCK_V}
    return KernelSpec("tree_accept_kernel", _TREE, f"{_q_variant(has_q)}-n{block_n}", signature, constexprs)


def _q_variant(has_q: bool) -> str:
    """The variant name of a sampled acceptance kernel: built for the draft's probabilities q, or for one-hot q
    (a draft that gives none)."""
    return "q" if has_q else "one_hot_q"


def compile_kernel(spec: KernelSpec, arch: int):
    """→ triton's CompiledKernel of one spec for sm_<arch> (no GPU needed)."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(importlib.import_module(spec.module), spec.kernel)
    source = ASTSource(fn=fn, signature=spec.signature, constexprs=spec.constexprs)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": spec.num_warps})


def _build_one(args) -> dict:
    spec, arch, out = args
    compiled = compile_kernel(spec, arch)
    stem = f"{spec.stem}.sm{arch}"
    (out / f"{stem}.ptx").write_text(compiled.asm["ptx"])
    (out / f"{stem}.cubin").write_bytes(compiled.asm["cubin"])
    return {
        "kernel": spec.kernel,
        "variant": spec.variant,
        "arch": arch,
        "entry": compiled.metadata.name,
        "signature": spec.signature,
        "constexprs": spec.constexprs,
        "num_warps": compiled.metadata.num_warps,
        "shared_bytes": compiled.metadata.shared,
        "ptx": f"{stem}.ptx",
        "cubin": f"{stem}.cubin",
    }


def build(archs: list[int], out: Path, jobs: int = 2, on_done=None) -> dict:
    """Compile every kernel for every arch into `out`; returns (and writes) the index. `on_done(entry)` reports
    progress."""
    out.mkdir(parents=True, exist_ok=True)
    work = [(spec, arch, out) for arch in archs for spec in kernel_specs()]
    entries = []
    with ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        for entry in pool.map(_build_one, work):
            entries.append(entry)
            if on_done is not None:
                on_done(entry)
    import triton

    index = {
        "triton": triton.__version__,
        "block_v": AOT_BLOCK_V,
        "kernels": entries,
        "specs": [asdict(s) for s in kernel_specs()],
    }
    (out / "index.json").write_text(json.dumps(index, indent=2))
    return index


def entry_params(ptx: str) -> list[str]:
    """The parameter names of the PTX's `.entry`, in order."""
    entry = re.search(r"\.entry\s+[\w$]+\s*\((.*?)\)", ptx, re.S)
    if entry is None:
        raise ValueError("no .entry in the PTX")
    return re.findall(r"\.param\s+[^,]*?([\w$]+)\s*(?:,|$)", entry.group(1).strip())


def tensorrt_ptx(spec: KernelSpec, compiled) -> str:
    """The kernel's PTX with exactly the parameters a TensorRT AOT plugin launches it with: its non-constexpr
    signature (input pointers, integer scalars, output pointers).

    triton >= 3.3 appends hidden parameters to every entry (third_party/nvidia/backend/compiler.py
    `make_llir`: a global-scratch and a profile-scratch pointer), which its own launcher fills; TensorRT's
    (tensorrt.plugin `aot_impl`, 10.14) passes the plugin's tensors and `SymIntExprs` only, so the driver would read
    two arguments past the ones it was given. When the kernel asks for no scratch (`global_scratch_size` and
    `profile_scratch_size` 0) the body never reads those parameters and they are dropped from the signature; a
    kernel that does use scratch is refused, naming the triton versions whose PTX needs no change (<= 3.2)."""
    ptx = compiled.asm["ptx"]
    params = entry_params(ptx)
    wanted = sum(1 for kind in spec.signature.values() if kind != "constexpr")
    hidden = params[wanted:]
    if not hidden:
        return ptx
    scratch = {k: getattr(compiled.metadata, k, 0) or 0 for k in ("global_scratch_size", "profile_scratch_size")}
    used = [p for p in hidden if len(re.findall(rf"\b{re.escape(p)}\b", ptx)) > 1]
    if any(scratch.values()) or used:
        raise ValueError(
            f"{spec.stem}: this triton's PTX takes {len(params)} parameters, TensorRT launches it with "
            f"{wanted}, and the kernel uses the hidden ones ({scratch}, read: {used}); compile it with "
            "triton <= 3.2, whose entries take exactly the signature"
        )
    entry = re.search(r"(\.entry\s+[\w$]+\s*\()(.*?)(\))", ptx, re.S)
    if entry is None:
        raise ValueError(f"{spec.stem}: the compiled PTX has no .entry declaration to take the hidden parameters from")
    kept = [line for line in entry.group(2).split("\n") if not any(re.search(rf"\b{p}\b", line) for p in hidden)]
    body = "\n".join(kept).rstrip().rstrip(",")
    return ptx[: entry.start(2)] + body + "\n" + ptx[entry.end(2) :]
