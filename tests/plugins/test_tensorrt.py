"""plugins/tensorrt.py through TensorRT's own Python plugin frontend, on CPU.

The frontend is the real `tensorrt.plugin` package of the tensorrt-cu13-bindings wheel (NVIDIA/TensorRT
python/packaging/bindings_wheel/tensorrt/plugin/); tests/plugins/trt_standin.py replaces only its C extension. So
`import plugins.tensorrt` runs TensorRT's signature validation on every registration, and `build_aot` asks each
plugin what TensorRT's builder asks an ahead-of-time plugin, through the frontend's own plugin classes. Kernel
compilation is recorded instead of run, so the launch each plugin returns is checked against the kernel spec it
picked; tests/plugins/test_cli.py compiles every spec and checks its PTX parameters against the same signature.
"""

import importlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import plugins
from plugins.aot import AOT_NODE_BLOCKS, AOT_SLOT_BLOCKS
from plugins.schema import OPS, PLUGIN_ATTRIBUTES, TRT_NAMESPACE
from tests.plugins.trt_standin import TensorIn, build_aot, tensorrt_plugin


@pytest.fixture(scope="module")
def trt_plugins():
    """(trt stand-in, the frontend's plugin registry, plugins.tensorrt) with every plugin registered."""
    with tensorrt_plugin() as (trt, trtp):
        QDP_REGISTRY = importlib.import_module("tensorrt.plugin._lib").QDP_REGISTRY  # the stand-in's, at run time

        import plugins.tensorrt as ours

        yield SimpleNamespace(trt=trt, trtp=trtp, registry=QDP_REGISTRY, module=ours)


def _ptx(spec, hidden: int = 2) -> str:
    """A PTX of the shape triton >= 3.3 writes for `spec`: one parameter per non-constexpr signature entry, then
    `hidden` scratch pointers its own launcher fills (third_party/nvidia/backend/compiler.py `make_llir`)."""
    n = sum(1 for kind in spec.signature.values() if kind != "constexpr") + hidden
    params = ",\n".join(f"\t.param .u64 {spec.kernel}_param_{i}" for i in range(n))
    return (
        f"// {spec.stem}\n.visible .entry {spec.kernel}(\n{params}\n)\n{{\n\tld.param.u64 %rd1, "
        f"[{spec.kernel}_param_0];\n\tret;\n}}\n"
    )


class _Compiled:
    """What plugins.tensorrt reads from triton's CompiledKernel (triton 3.9: two hidden scratch pointers, no
    scratch used)."""

    def __init__(self, spec):
        self.metadata = SimpleNamespace(
            name=spec.kernel, num_warps=spec.num_warps, shared=96, global_scratch_size=0, profile_scratch_size=0
        )
        self.asm = {"ptx": _ptx(spec)}


@pytest.fixture
def compiled(trt_plugins, monkeypatch):
    """Every KernelSpec the plugins compile, in order, for an sm_90 build GPU; nothing is compiled."""
    specs = []

    def record(spec, arch):
        assert arch == 90
        specs.append(spec)
        return _Compiled(spec)

    monkeypatch.setattr(trt_plugins.module, "compile_kernel", record)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    return specs


def test_every_op_registers_through_tensorrts_validation(trt_plugins):
    """NVIDIA/TensorRT python/packaging/bindings_wheel/tensorrt/plugin/_validate.py: `_parse_register_inputs` takes
    each parameter's annotation as a class (`issubclass(param.annotation, TensorDesc)`: a postponed, string
    annotation raises TypeError), `_parse_register_return` counts the outputs from the return annotation, and
    `_validate_aot_impl` requires the (tensors, attributes, outputs, tactic) schema and a return annotation of
    (str | bytes, str | bytes, KernelLaunchParams, SymExprs). The decorators ran them when plugins.tensorrt was
    imported."""
    registered = {pid: d for pid, d in trt_plugins.registry.items() if pid.startswith(f"{TRT_NAMESPACE}::")}
    assert sorted(registered) == sorted(f"{TRT_NAMESPACE}::{op}" for op in OPS)
    for op, outputs in OPS.items():
        plugin = registered[f"{TRT_NAMESPACE}::{op}"]
        assert plugin.aot_impl_func is not None, op
        assert plugin.num_outputs == len(outputs), op
        assert tuple(plugin.input_attrs) == PLUGIN_ATTRIBUTES[op], op
        assert plugin.aot_impl_attr_names == list(PLUGIN_ATTRIBUTES[op]), op  # TensorRT passes them all


def test_tensorrts_validation_refuses_a_postponed_annotation(trt_plugins):
    """Negative control for the test above: the same registration with string annotations (what
    `from __future__ import annotations` makes of every one) fails in `_parse_register_inputs`."""

    def desc(logits):
        return logits.like()

    desc.__annotations__ = {"logits": "trtp.TensorDesc", "return": "trtp.TensorDesc"}  # as the future import writes

    with pytest.raises(TypeError, match="issubclass"):
        trt_plugins.trtp.register("deepspec_test::postponed")(desc)


def _i64(*shape):
    return torch.zeros(shape, dtype=torch.long)


def _f32(*shape):
    return torch.rand(shape)


def _chain_case(B=3, k=4, V=50):
    drafts, num, logits = _i64(B, k), torch.full((B,), k), _f32(B, k + 1, V)
    sampling = [torch.ones(B), _i64(B), torch.ones(B), _i64(B)]
    return drafts, num, logits, sampling


def _cases():
    """op → (its torch inputs in the plugin's order, node attributes, the launch grid, the kernel's integer
    scalars) — what the plugin must hand TensorRT for those inputs."""
    B, k, V, N = 3, 4, 50, 6
    drafts, num, logits, sampling = _chain_case(B, k, V)
    absent = torch.zeros(0)  # an absent draft_probs in ONNX and TensorRT (plugins.onnx_ops.absent)
    tree = [_i64(B, N), torch.tensor([[-1, 0, 0, 1, 2, 3]] * B), torch.full((B,), N), _f32(B, N, V)]
    L, H, S, D = 2, 2, 16, 8
    return {
        "greedy_accept": ([drafts, num, logits], {}, (B, 1, 1), [k, V]),
        "rejection_sample": ([drafts, num, logits, absent, *sampling], {"has_draft_probs": 0}, (B, 1, 1), [k, V]),
        "rejection_sample q": (
            [drafts, num, logits, _f32(B, k, V), *sampling],
            {"has_draft_probs": 1},
            (B, 1, 1),
            [k, V],
        ),
        "process_logits": ([logits, *sampling[:3]], {}, (B * (k + 1), 1, 1), [k + 1, V]),
        "tree_accept": ([*tree, absent, *sampling], {"has_draft_probs": 0}, (B, 1, 1), [N, V]),
        "tree_accept q": ([*tree, _f32(B, N, V), *sampling], {"has_draft_probs": 1}, (B, 1, 1), [N, V]),
        "compact_kv": (
            [_f32(L, B, H, S, D), _i64(B), torch.tensor([[0, 1, -1, -1, -1, -1]] * B), _i64(B)],
            {},
            (B, L * H, 1),
            [B, H, S, N, D],
        ),
        "confidence_truncate": ([_f32(B, k), num], {"threshold": 0.25}, (B, 1, 1), [k]),
    }


def _trt_dtype(trt, tensor):
    return {
        torch.float32: trt.DataType.FLOAT,
        torch.int64: trt.DataType.INT64,
        torch.bfloat16: trt.DataType.BF16,
        torch.float16: trt.DataType.HALF,
    }[tensor.dtype]


def _build(trt, op, inputs, attrs, **dynamic):
    """build_aot of `op` on these torch inputs' shapes and dtypes; `dynamic` maps an input index to (the dims
    the profile leaves open, its max shape)."""
    tensors = []
    for i, t in enumerate(inputs):
        dims, max_shape = dynamic.get(f"input{i}", ((), None))
        tensors.append(TensorIn(tuple(t.shape), _trt_dtype(trt, t), dims, max_shape))
    return build_aot(trt, f"{TRT_NAMESPACE}::{op}", tensors, attrs)


def _eager(op, inputs, attrs):
    """The torch op's outputs on the same inputs (compact_kv out of place, as the plugin is)."""
    if op == "compact_kv":  # four tensors, none of them optional
        cache, start, path, num_accepted = inputs
        return (plugins.compact_kv(cache.clone(), start, path, num_accepted),)
    args = [None if t.numel() == 0 and t.ndim == 1 and t.is_floating_point() else t for t in inputs]
    out = getattr(plugins, op)(*args, *attrs.values()) if op == "confidence_truncate" else getattr(plugins, op)(*args)
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("case", list(_cases()))
def test_the_builder_gets_each_ops_shapes_launch_and_scalars(trt_plugins, compiled, case):
    """What TensorRT's builder takes from an AOT plugin (NVIDIA/TensorRT python/packaging/bindings_wheel/tensorrt/
    plugin/_plugin_class.py, `_TemplateAOTPlugin.get_launch_params`: the aot_impl's grid, block, shared memory and
    its SymInt32 extra arguments, which TensorRT passes between the input and the output pointers): output shapes
    and dtypes equal the torch op's, one program per row, and the scalars are the kernel's integer parameters in
    its signature's order, between as many pointers as the plugin has inputs and outputs. The plugin is made from
    the node's attributes as one-element arrays (`_lib.py`, `_TemplatePluginCreator.create_plugin`: an `int` /
    `float` annotation there means `int(array)`, which this numpy refuses)."""
    op = case.split()[0]
    inputs, attrs, grid, scalars = _cases()[case]
    built = _build(trt_plugins.trt, op, inputs, attrs)
    want = _eager(op, inputs, attrs)
    assert built.output_shapes == [tuple(t.shape) for t in want]
    assert built.output_dtypes == [_trt_dtype(trt_plugins.trt, t) for t in want]
    assert built.grid == grid and built.scalars == scalars
    (spec,) = compiled
    assert built.block == (spec.num_warps * 32, 1, 1) and built.shared_mem == 96
    assert built.kernel_name == spec.kernel and built.ptx == _ptx(spec, hidden=0).encode()
    kinds = ["ptr" if t.startswith("*") else t for t in spec.signature.values() if t != "constexpr"]
    assert kinds == ["ptr"] * len(inputs) + ["i32"] * len(scalars) + ["ptr"] * len(want), spec.stem
    assert all(t == trt_plugins.trt.PluginArgDataType.INT32 for t in built.scalar_types)
    if "has_draft_probs" in attrs:
        assert spec.constexprs["HAS_Q"] == bool(attrs["has_draft_probs"])
    if op == "confidence_truncate":
        assert spec.constexprs["THRESHOLD"] == pytest.approx(attrs["threshold"])


# ---- the ahead-of-time tree and slot sizes -------------------------------------------------------------------
def _tree_inputs(B, N, V=11):
    return [
        _i64(B, N),
        torch.tensor([[-1] + list(range(N - 1))] * B),
        torch.full((B,), N),
        _f32(B, N, V),
        torch.zeros(0),
        torch.ones(B),
        _i64(B),
        torch.ones(B),
        _i64(B),
    ]


@pytest.mark.parametrize("num_nodes", [2, 16, 17, 33, 64, 65, max(AOT_NODE_BLOCKS)])
def test_tree_accept_is_built_for_a_size_that_holds_its_tree(trt_plugins, compiled, num_nodes):
    """The engine drafts num_speculative_tokens nodes plus the root: 33 at the service's cap of 32, 65 and more
    under `training eval --verify-all`. The kernel keeps a tree in BLOCK_N register lanes and ignores nodes past
    them, so the plugin must build the smallest compiled size that holds the tree, up to the largest one."""
    _build(trt_plugins.trt, "tree_accept", _tree_inputs(2, num_nodes), {"has_draft_probs": 0})
    (spec,) = compiled
    assert spec.constexprs["BLOCK_N"] == min(b for b in AOT_NODE_BLOCKS if b >= num_nodes)


def test_tree_accept_with_a_dynamic_tree_size_is_built_for_the_profiles_largest(trt_plugins, compiled):
    """A dimension the optimization profile leaves open reaches getLaunchParams as -1 with the profile's bounds
    (`DynamicPluginTensorDesc.max`, read through `TensorDesc.shape.max`): the kernel must hold the largest tree."""
    inputs = _tree_inputs(2, 8)
    tree_dims = ((1,), (2, 100))
    _build(trt_plugins.trt, "tree_accept", inputs, {"has_draft_probs": 1}, input0=tree_dims)
    (spec,) = compiled
    assert spec.constexprs["BLOCK_N"] == min(b for b in AOT_NODE_BLOCKS if b >= 100)


def test_a_tree_larger_than_every_compiled_size_is_refused(trt_plugins, compiled):
    too_many = max(AOT_NODE_BLOCKS) + 1
    with pytest.raises(
        ValueError,
        match=rf"deepspec::tree_accept: {too_many} tree nodes .* more than the "
        rf"{max(AOT_NODE_BLOCKS)} its ahead-of-time kernels are built for",
    ):
        _build(trt_plugins.trt, "tree_accept", _tree_inputs(1, too_many), {"has_draft_probs": 0})
    assert compiled == []


@pytest.mark.parametrize("num_slots", [7, 32, 33, max(AOT_SLOT_BLOCKS)])
def test_confidence_truncate_is_built_for_a_size_that_holds_its_slots(trt_plugins, compiled, num_slots):
    _build(
        trt_plugins.trt, "confidence_truncate", [_f32(2, num_slots), torch.full((2,), num_slots)], {"threshold": 0.5}
    )
    (spec,) = compiled
    assert spec.constexprs["BLOCK_K"] == min(b for b in AOT_SLOT_BLOCKS if b >= num_slots)


def test_more_draft_slots_than_every_compiled_size_are_refused(trt_plugins, compiled):
    too_many = max(AOT_SLOT_BLOCKS) + 1
    with pytest.raises(ValueError, match=rf"deepspec::confidence_truncate: {too_many} draft slots"):
        _build(
            trt_plugins.trt,
            "confidence_truncate",
            [_f32(1, too_many), torch.ones(1, dtype=torch.long)],
            {"threshold": 0.5},
        )
    assert compiled == []


@pytest.mark.parametrize("case", list(_cases()))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_float_inputs_are_refused_not_misread(trt_plugins, compiled, case, dtype):
    """Every kernel is compiled for fp32 floats (plugins.aot signatures): a bf16 or fp16 tensor handed to it would
    be read as fp32 bits. TensorRT passes the network's tensors as they are (the descriptors' `dtype`,
    NVIDIA/TensorRT python/packaging/bindings_wheel/tensorrt/plugin/_tensor.py `TensorDesc.dtype`), so the plugin
    must refuse them when the engine is built. Each op's first float input is made half precision in turn."""
    op = case.split()[0]
    inputs, attrs, _, _ = _cases()[case]
    first_float = next(i for i, t in enumerate(inputs) if t.is_floating_point() and t.numel())
    inputs = [t.to(dtype) if i == first_float else t for i, t in enumerate(inputs)]
    with pytest.raises(ValueError, match=r"the ahead-of-time kernel reads fp32"):
        _build(trt_plugins.trt, op, inputs, attrs)


# ---- the PTX's parameters: TensorRT's AOT launch contract ------------------------------------------------------
#: compiles greedy_accept for sm_90 with the installed triton and writes (raw count, handed count, ptxas path) plus
#: the PTX the plugin hands TensorRT; a process of its own, since tests/plugins/test_kernels.py turns this one's
#: kernels into TRITON_INTERPRET ones, which do not compile
_COMPILE_SCRIPT = """
import json, sys
from pathlib import Path
from plugins.aot import compile_kernel, entry_params, kernel_specs, tensorrt_ptx
from triton.backends.nvidia.compiler import get_ptxas
spec = next(s for s in kernel_specs() if s.kernel == "greedy_accept_kernel")
compiled = compile_kernel(spec, 90)
ptx = tensorrt_ptx(spec, compiled)
Path(sys.argv[1]).write_text(ptx)
ptxas = get_ptxas(90)
print(json.dumps([len(entry_params(compiled.asm["ptx"])), len(entry_params(ptx)),
                  getattr(ptxas, "path", None) or ptxas[0]]))
"""


def test_the_ptx_takes_exactly_the_parameters_tensorrt_passes(tmp_path):
    """The installed triton (the `plugins` extra pins 3.9) compiles greedy_accept for sm_90; TensorRT launches an AOT
    kernel with its inputs, SymInt32 scalars and outputs only (tensorrt.plugin `aot_impl`, 10.14), while triton >= 3.3
    appends two scratch pointers to every entry. The PTX the plugin hands TensorRT declares the signature's 7 and
    still assembles with triton's own ptxas."""
    import json
    import os
    import subprocess
    import sys

    repo_root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", _COMPILE_SCRIPT, str(tmp_path / "k.ptx")],
        cwd=repo_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    raw, handed, ptxas = json.loads(done.stdout.strip().splitlines()[-1])
    assert handed == 7 <= raw
    result = subprocess.run(
        [ptxas, "-arch=sm_90a", str(tmp_path / "k.ptx"), "-o", str(tmp_path / "k.cubin")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def test_a_kernel_that_reads_its_scratch_pointer_is_refused():
    from plugins.aot import kernel_specs, tensorrt_ptx

    spec = next(s for s in kernel_specs() if s.kernel == "greedy_accept_kernel")
    used = SimpleNamespace(
        metadata=SimpleNamespace(global_scratch_size=0, profile_scratch_size=0),
        asm={"ptx": _ptx(spec).replace("_param_0];", "_param_7];")},
    )
    with pytest.raises(ValueError, match="triton <= 3.2"):
        tensorrt_ptx(spec, used)
    sized = SimpleNamespace(
        metadata=SimpleNamespace(global_scratch_size=256, profile_scratch_size=0), asm={"ptx": _ptx(spec)}
    )
    with pytest.raises(ValueError, match="takes 9 parameters, TensorRT launches it with 7"):
        tensorrt_ptx(spec, sized)
