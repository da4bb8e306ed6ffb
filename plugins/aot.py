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


def kernel_specs() -> list[KernelSpec]:
    chain, tree = "plugins.kernels.chain", "plugins.kernels.tree"
    bv = {"BLOCK_V": AOT_BLOCK_V}
    specs = [
        KernelSpec(
            "greedy_accept_kernel",
            chain,
            "",
            {
                **_ptrs(draft_ptr="i64", num_ptr="i64", logits_ptr="fp32"),
                "K": "i32",
                "V": "i32",
                **_ptrs(out_num_ptr="i64", out_next_ptr="i64"),
                "BLOCK_V": "constexpr",
            },
            bv,
        ),
        KernelSpec(
            "process_logits_kernel",
            chain,
            "",
            {
                **_ptrs(logits_ptr="fp32", temp_ptr="fp32", topk_ptr="i64", topp_ptr="fp32"),
                "T_LEN": "i32",
                "V": "i32",
                **_ptrs(out_ptr="fp32"),
                "BLOCK_V": "constexpr",
            },
            bv,
        ),
        KernelSpec(
            "compact_kv_kernel",
            tree,
            "",
            {
                **_ptrs(cache_ptr="fp32", start_ptr="i64", path_ptr="i64", num_ptr="i64"),
                "H": "i32",
                "N": "i32",
                "stride_l": "i64",
                "stride_b": "i64",
                "stride_h": "i64",
                "stride_s": "i64",
                "D": "i32",
                "BLOCK_D": "constexpr",
            },
            {"BLOCK_D": 128},
        ),
        KernelSpec(
            "compact_kv_out_kernel",
            tree,
            "",
            {
                **_ptrs(cache_ptr="fp32", start_ptr="i64", path_ptr="i64", num_ptr="i64"),
                "B": "i32",
                "H": "i32",
                "S": "i32",
                "N": "i32",
                "D": "i32",
                **_ptrs(out_ptr="fp32"),
                "BLOCK_S": "constexpr",
                "BLOCK_D": "constexpr",
            },
            {"BLOCK_S": AOT_BLOCK_S, "BLOCK_D": AOT_BLOCK_D},
        ),
    ]
    for block_k in AOT_SLOT_BLOCKS:
        specs.append(
            KernelSpec(
                "confidence_truncate_kernel",
                chain,
                f"k{block_k}",
                {
                    **_ptrs(conf_ptr="fp32", num_ptr="i64"),
                    "K": "i32",
                    **_ptrs(out_num_ptr="i64", out_surv_ptr="fp32"),
                    "THRESHOLD": "constexpr",
                    "BLOCK_K": "constexpr",
                },
                {"THRESHOLD": AOT_THRESHOLD, "BLOCK_K": block_k},
            )
        )
    for has_q in (False, True):
        specs.append(
            KernelSpec(
                "rejection_sample_kernel",
                chain,
                "q" if has_q else "one_hot_q",
                {
                    **_ptrs(
                        draft_ptr="i64",
                        num_ptr="i64",
                        logits_ptr="fp32",
                        q_ptr="fp32",
                        temp_ptr="fp32",
                        topk_ptr="i64",
                        topp_ptr="fp32",
                        seed_ptr="i64",
                    ),
                    "K": "i32",
                    "V": "i32",
                    **_ptrs(out_num_ptr="i64", out_next_ptr="i64"),
                    "HAS_Q": "constexpr",
                    "BLOCK_V": "constexpr",
                },
                {"HAS_Q": has_q, **bv},
            )
        )
        for block_n in AOT_NODE_BLOCKS:
            specs.append(
                KernelSpec(
                    "tree_accept_kernel",
                    tree,
                    ("q" if has_q else "one_hot_q") + f"-n{block_n}",
                    {
                        **_ptrs(
                            tokens_ptr="i64",
                            parents_ptr="i64",
                            num_ptr="i64",
                            logits_ptr="fp32",
                            q_ptr="fp32",
                            temp_ptr="fp32",
                            topk_ptr="i64",
                            topp_ptr="fp32",
                            seed_ptr="i64",
                        ),
                        "N": "i32",
                        "V": "i32",
                        **_ptrs(out_num_ptr="i64", out_next_ptr="i64", out_path_ptr="i64"),
                        "HAS_Q": "constexpr",
                        "BLOCK_N": "constexpr",
                        "BLOCK_V": "constexpr",
                    },
                    {"HAS_Q": has_q, "BLOCK_N": block_n, **bv},
                )
            )
    return specs


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
