"""Every op as a TensorRT Python plugin (`tensorrt.plugin`, TensorRT >= 10.9) with an ahead-of-time Triton kernel.

`@trtp.register("deepspec::<op>")` gives output shapes and dtypes from the input descriptors; `@trtp.aot_impl`
compiles the op's Triton kernel for the building GPU (plugins.aot.compile_kernel) and returns its entry name, PTX,
launch parameters (grid = one program per row, block = 32 * num_warps, shared memory) and the integer scalars it
takes (sizes read from the shape expressions). Kernel parameters are ordered input pointers, scalars, output
pointers: the order TensorRT launches an AOT kernel with. The ONNX nodes that plugins.ops exports carry
`plugin_namespace="deepspec"`, `plugin_version="1"`, `aot=1`, so TensorRT's ONNX parser binds them here:

    import plugins.tensorrt   # registers the plugins; then parse the ONNX graph with trt.OnnxParser as usual

`tree_accept` runs greedy and sampled rows in one kernel (variant by `has_draft_probs`), built for the smallest
of plugins.aot.AOT_NODE_BLOCKS that holds the largest tree of the engine's optimization profile; `confidence_truncate`
likewise for its draft slots. A larger tree is refused when the engine is built. `compact_kv` is the out-of-place
kernel: a TensorRT graph has no in-place update, so the plugin writes a new cache tensor (ONNX's semantics of the
node). Importing this module without TensorRT raises ImportError saying so.

TensorRT validates these functions by their annotations, as classes (`issubclass(annotation, TensorDesc)`), and
requires a return annotation on every `register` and `aot_impl`: this module must not use
`from __future__ import annotations`, which would turn them into strings. tests/plugins/test_tensorrt.py runs the
registrations through TensorRT's own frontend.
"""

try:
    import tensorrt as trt

    # TensorRT is installed on GPU machines only
    import tensorrt.plugin as trtp  # pyright: ignore[reportMissingImports]
except ImportError as exc:  # the one place that needs TensorRT: say what is missing and how to get it
    raise ImportError(
        "plugins.tensorrt needs TensorRT >= 10.9 with its Python plugin API (tensorrt.plugin), which is not "
        f"importable here ({exc}); install it on a machine with an NVIDIA GPU (pip install tensorrt), or run the "
        "ops through PyTorch or ONNX Runtime instead"
    ) from exc

import numpy as np
import numpy.typing as npt

from plugins.aot import (
    AOT_NODE_BLOCKS,
    AOT_SLOT_BLOCKS,
    KernelSpec,
    aot_block,
    compile_kernel,
    kernel_specs,
    tensorrt_ptx,
)
from plugins.schema import TRT_NAMESPACE

_I64 = trt.int64  # pyright: ignore[reportAttributeAccessIssue]  # the CPU venv's tensorrt stub lacks TensorRT's dtypes

#: what an aot_impl returns, spelled as TensorRT's validation requires: (entry name, PTX, launch, integer scalars)
AOTKernel = tuple[str | bytes, str | bytes, trtp.KernelLaunchParams, trtp.SymIntExprs]

#: node attributes, typed as one-element arrays: TensorRT 10.x makes a builtin-typed attribute (`int`, `float`) a
#: scalar with int(array) / float(array), which numpy 2.4 refuses for the 1-d array a plugin field holds; an
#: array-typed attribute is kept as an array (`astype`), in every TensorRT version
IntAttr = npt.NDArray[np.int64]
FloatAttr = npt.NDArray[np.float32]


def _scalar(attr: np.ndarray) -> int | float:
    """The value of a one-element attribute array."""
    values = np.asarray(attr).reshape(-1)
    if values.size != 1:
        raise ValueError(f"a deepspec plugin attribute holds one value, got {values.size}: {values.tolist()}")
    return values.item()


def _ids(B) -> trtp.TensorDesc:
    return trtp.from_shape_expr((B,), dtype=_I64)


def _max_extent(desc: trtp.TensorDesc, dim: int) -> int:
    """The largest size dimension `dim` of an input takes: its size, or the optimization profile's upper bound
    where the engine leaves it dynamic (-1)."""
    size = desc.shape[dim]
    return desc.shape.max[dim] if size < 0 else size


def _spec(kernel: str, variant: str = "", **constexprs) -> KernelSpec:
    spec = next(s for s in kernel_specs() if s.kernel == kernel and s.variant == variant)
    return KernelSpec(
        spec.kernel, spec.module, spec.variant, spec.signature, {**spec.constexprs, **constexprs}, spec.num_warps
    )


#: the element types the kernels are compiled for (plugins.aot signatures), as TensorRT names them
# the CPU venv's tensorrt stub lacks TensorRT's dtypes
_KERNEL_DTYPES = {"*fp32": trt.float32, "*i64": trt.int64}  # pyright: ignore[reportAttributeAccessIssue]


def _check_input_dtypes(spec: KernelSpec, inputs) -> None:
    """Refuse inputs whose element type is not the one the kernel reads: a kernel built for fp32 logits would
    read bf16 or fp16 logits as garbage, silently. The inputs are the first pointers of the signature."""
    pointers = [(name, kind) for name, kind in spec.signature.items() if kind.startswith("*")]
    assert len(inputs) <= len(pointers), (spec.stem, len(inputs))
    for (name, want), desc in zip(pointers, inputs):
        if desc.dtype != _KERNEL_DTYPES[want]:
            raise ValueError(
                f"{TRT_NAMESPACE}::{spec.kernel}: input {name.removesuffix('_ptr')} is {desc.dtype}, "
                f"but the ahead-of-time kernel reads {want[1:]}; cast it to {want[1:]} in the network "
                "before the node"
            )


def _aot(spec: KernelSpec, grid, scalars: list, grid_y=1, inputs=()) -> AOTKernel:
    """(entry name, PTX, launch params, scalar args) of one kernel compiled for the GPU TensorRT builds on, after
    checking the `inputs` descriptors' element types against the kernel's."""
    import torch

    _check_input_dtypes(spec, inputs)

    major, minor = torch.cuda.get_device_capability()
    compiled = compile_kernel(spec, major * 10 + minor)
    launch = trtp.KernelLaunchParams()
    launch.grid_x = grid
    launch.grid_y = grid_y
    launch.block_x = compiled.metadata.num_warps * 32
    launch.shared_mem = compiled.metadata.shared
    extra = trtp.SymIntExprs(len(scalars))
    for i, value in enumerate(scalars):
        extra[i] = trtp.SymInt32(value)
    return compiled.metadata.name, tensorrt_ptx(spec, compiled), launch, extra


def _sampled_accept(
    kernel: str, has_draft_probs: IntAttr, drafts, target_logits, inputs, size_variant: str = ""
) -> AOTKernel:
    """An accept kernel that samples (rejection_sample, tree_accept): the variant reading the drafter's q when the
    node has them, else the one-hot one (and the tree size's, `-n<BLOCK_N>`); one program per row, sized by the
    drafts' width and the vocabulary."""
    spec = _spec(kernel, ("q" if _scalar(has_draft_probs) else "one_hot_q") + size_variant)
    return _aot(spec, drafts.shape_expr[0], [drafts.shape_expr[1], target_logits.shape_expr[2]], inputs=inputs)


# ---- greedy_accept ---------------------------------------------------------------------------------------------
@trtp.register(f"{TRT_NAMESPACE}::greedy_accept")
def greedy_accept_desc(
    draft_tokens: trtp.TensorDesc, num_draft_tokens: trtp.TensorDesc, target_logits: trtp.TensorDesc
) -> tuple[trtp.TensorDesc, trtp.TensorDesc]:
    B = draft_tokens.shape_expr[0]
    return _ids(B), _ids(B)


@trtp.aot_impl(f"{TRT_NAMESPACE}::greedy_accept")
def greedy_accept_aot(
    draft_tokens: trtp.TensorDesc,
    num_draft_tokens: trtp.TensorDesc,
    target_logits: trtp.TensorDesc,
    outputs: tuple[trtp.TensorDesc],
    tactic: int,
) -> AOTKernel:
    return _aot(
        _spec("greedy_accept_kernel"),
        draft_tokens.shape_expr[0],
        [draft_tokens.shape_expr[1], target_logits.shape_expr[2]],
        inputs=(draft_tokens, num_draft_tokens, target_logits),
    )


# ---- rejection_sample ------------------------------------------------------------------------------------------
@trtp.register(f"{TRT_NAMESPACE}::rejection_sample")
def rejection_sample_desc(
    draft_tokens: trtp.TensorDesc,
    num_draft_tokens: trtp.TensorDesc,
    target_logits: trtp.TensorDesc,
    draft_probs: trtp.TensorDesc,
    temperature: trtp.TensorDesc,
    top_k: trtp.TensorDesc,
    top_p: trtp.TensorDesc,
    seeds: trtp.TensorDesc,
    has_draft_probs: IntAttr,
) -> tuple[trtp.TensorDesc, trtp.TensorDesc]:
    B = draft_tokens.shape_expr[0]
    return _ids(B), _ids(B)


@trtp.aot_impl(f"{TRT_NAMESPACE}::rejection_sample")
def rejection_sample_aot(
    draft_tokens: trtp.TensorDesc,
    num_draft_tokens: trtp.TensorDesc,
    target_logits: trtp.TensorDesc,
    draft_probs: trtp.TensorDesc,
    temperature: trtp.TensorDesc,
    top_k: trtp.TensorDesc,
    top_p: trtp.TensorDesc,
    seeds: trtp.TensorDesc,
    has_draft_probs: IntAttr,
    outputs: tuple[trtp.TensorDesc],
    tactic: int,
) -> AOTKernel:
    return _sampled_accept(
        "rejection_sample_kernel",
        has_draft_probs,
        draft_tokens,
        target_logits,
        (draft_tokens, num_draft_tokens, target_logits, draft_probs, temperature, top_k, top_p, seeds),
    )


# ---- process_logits --------------------------------------------------------------------------------------------
@trtp.register(f"{TRT_NAMESPACE}::process_logits")
def process_logits_desc(
    logits: trtp.TensorDesc, temperature: trtp.TensorDesc, top_k: trtp.TensorDesc, top_p: trtp.TensorDesc
) -> trtp.TensorDesc:
    return logits.like()


@trtp.aot_impl(f"{TRT_NAMESPACE}::process_logits")
def process_logits_aot(
    logits: trtp.TensorDesc,
    temperature: trtp.TensorDesc,
    top_k: trtp.TensorDesc,
    top_p: trtp.TensorDesc,
    outputs: tuple[trtp.TensorDesc],
    tactic: int,
) -> AOTKernel:
    B, T, V = logits.shape_expr[0], logits.shape_expr[1], logits.shape_expr[2]
    return _aot(_spec("process_logits_kernel"), B * T, [T, V], inputs=(logits, temperature, top_k, top_p))


# ---- tree_accept ----------------------------------------------------------------------------------------------
@trtp.register(f"{TRT_NAMESPACE}::tree_accept")
def tree_accept_desc(
    tree_tokens: trtp.TensorDesc,
    parents: trtp.TensorDesc,
    num_nodes: trtp.TensorDesc,
    target_logits: trtp.TensorDesc,
    draft_probs: trtp.TensorDesc,
    temperature: trtp.TensorDesc,
    top_k: trtp.TensorDesc,
    top_p: trtp.TensorDesc,
    seeds: trtp.TensorDesc,
    has_draft_probs: IntAttr,
) -> tuple[trtp.TensorDesc, trtp.TensorDesc, trtp.TensorDesc]:
    B = tree_tokens.shape_expr[0]
    return _ids(B), _ids(B), tree_tokens.like()


@trtp.aot_impl(f"{TRT_NAMESPACE}::tree_accept")
def tree_accept_aot(
    tree_tokens: trtp.TensorDesc,
    parents: trtp.TensorDesc,
    num_nodes: trtp.TensorDesc,
    target_logits: trtp.TensorDesc,
    draft_probs: trtp.TensorDesc,
    temperature: trtp.TensorDesc,
    top_k: trtp.TensorDesc,
    top_p: trtp.TensorDesc,
    seeds: trtp.TensorDesc,
    has_draft_probs: IntAttr,
    outputs: tuple[trtp.TensorDesc],
    tactic: int,
) -> AOTKernel:
    block_n = aot_block(
        _max_extent(tree_tokens, 1),
        AOT_NODE_BLOCKS,
        f"{TRT_NAMESPACE}::tree_accept",
        "tree nodes (num_speculative_tokens + the root)",
    )
    inputs = (tree_tokens, parents, num_nodes, target_logits, draft_probs, temperature, top_k, top_p, seeds)
    return _sampled_accept("tree_accept_kernel", has_draft_probs, tree_tokens, target_logits, inputs, f"-n{block_n}")


# ---- compact_kv (out of place) ---------------------------------------------------------------------------------
@trtp.register(f"{TRT_NAMESPACE}::compact_kv")
def compact_kv_desc(
    cache: trtp.TensorDesc, start: trtp.TensorDesc, path: trtp.TensorDesc, num_accepted: trtp.TensorDesc
) -> trtp.TensorDesc:
    return cache.like()


@trtp.aot_impl(f"{TRT_NAMESPACE}::compact_kv")
def compact_kv_aot(
    cache: trtp.TensorDesc,
    start: trtp.TensorDesc,
    path: trtp.TensorDesc,
    num_accepted: trtp.TensorDesc,
    outputs: tuple[trtp.TensorDesc],
    tactic: int,
) -> AOTKernel:
    L, B, H, S, D = (cache.shape_expr[i] for i in range(5))
    return _aot(
        _spec("compact_kv_out_kernel"),
        B,
        [B, H, S, path.shape_expr[1], D],
        grid_y=L * H,
        inputs=(cache, start, path, num_accepted),
    )


# ---- confidence_truncate ---------------------------------------------------------------------------------------
@trtp.register(f"{TRT_NAMESPACE}::confidence_truncate")
def confidence_truncate_desc(
    confidence: trtp.TensorDesc, num_draft_tokens: trtp.TensorDesc, threshold: FloatAttr
) -> tuple[trtp.TensorDesc, trtp.TensorDesc]:
    return _ids(confidence.shape_expr[0]), confidence.like()


@trtp.aot_impl(f"{TRT_NAMESPACE}::confidence_truncate")
def confidence_truncate_aot(
    confidence: trtp.TensorDesc,
    num_draft_tokens: trtp.TensorDesc,
    threshold: FloatAttr,
    outputs: tuple[trtp.TensorDesc],
    tactic: int,
) -> AOTKernel:
    block_k = aot_block(
        _max_extent(confidence, 1),
        AOT_SLOT_BLOCKS,
        f"{TRT_NAMESPACE}::confidence_truncate",
        "draft slots (num_speculative_tokens)",
    )
    return _aot(
        _spec("confidence_truncate_kernel", f"k{block_k}", THRESHOLD=float(_scalar(threshold))),
        confidence.shape_expr[0],
        [confidence.shape_expr[1]],
        inputs=(confidence, num_draft_tokens),
    )
