"""Part `tensorrt`: does TensorRT 10.14 launch a Triton AOT kernel of ours, compiled by the installed triton?

triton >= 3.3 appends two scratch-pointer parameters to every kernel entry, which its own launcher fills and
TensorRT's AOT launch (inputs, SymInt32 scalars, outputs) does not; TensorRT's own 10.14 sample pins triton 3.2.
plugins.aot.tensorrt_ptx drops those parameters when the kernel uses no scratch. Two rows settle it:

- `AOT contract greedy_accept`: the installed triton's PTX for this GPU, its entry's parameter count before and
  after tensorrt_ptx (runs without a GPU);
- `TensorRT engine deepspec::greedy_accept`: a one-node network (the plugin on three inputs) built by TensorRT's
  builder with the AOT implementation, run, and compared with the PyTorch reference on the same inputs. A FAIL
  here with the contract row OK means the PTX is not what this TensorRT launches: the row names triton's version,
  so the next run can pin the one that works.
"""

from __future__ import annotations

from bench.gpu_check.context import guarded
from bench.gpu_check.report import FAIL, OK, SKIPPED, Row

#: the test case: rows, draft tokens per row, vocabulary
B, K, V = 4, 5, 4096


def _arch(device: str) -> int:
    import torch

    if device == "cuda":
        major, minor = torch.cuda.get_device_capability()
        return major * 10 + minor
    return 90


def contract_rows(device: str) -> list[Row]:
    import triton

    from plugins.aot import compile_kernel, entry_params, kernel_specs, tensorrt_ptx

    spec = next(s for s in kernel_specs() if s.kernel == "greedy_accept_kernel")
    arch = _arch(device)
    compiled = compile_kernel(spec, arch)
    raw, launched = len(entry_params(compiled.asm["ptx"])), len(entry_params(tensorrt_ptx(spec, compiled)))
    wanted = sum(1 for kind in spec.signature.values() if kind != "constexpr")
    status = OK if launched == wanted else FAIL
    return [
        Row(
            "AOT contract greedy_accept",
            status,
            f"triton {triton.__version__} sm_{arch}: PTX entry takes {raw} parameters, the plugin hands "
            f"TensorRT {launched}, TensorRT passes {wanted}",
            {"ptx_params": raw, "launched_params": launched},
        )
    ]


def _inputs():
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(B, K + 1, V, device="cuda", generator=g)
    drafts = logits[:, :K].argmax(-1)
    drafts[1, 2] = (drafts[1, 2] + 1) % V  # one row rejects mid-way
    num = torch.tensor([K, K, 3, 0], device="cuda", dtype=torch.int64)
    return drafts.contiguous(), num, logits.contiguous()


def _build_engine(trt, trtp, drafts, num, logits):
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    inputs = [
        network.add_input(name, dtype, tuple(t.shape))
        for name, dtype, t in (
            ("draft_tokens", trt.int64, drafts),
            ("num_draft_tokens", trt.int64, num),
            ("target_logits", trt.float32, logits),
        )
    ]
    layer = network.add_plugin(trtp.op.deepspec.greedy_accept(*inputs), aot=True)
    for i, name in enumerate(("num_accepted", "next_token")):
        out = layer.get_output(i)
        out.name = name
        network.mark_output(out)
    serialized = builder.build_serialized_network(network, builder.create_builder_config())
    if serialized is None:
        raise RuntimeError("TensorRT's builder returned no engine (its log above says why)")
    return trt.Runtime(logger).deserialize_cuda_engine(serialized)


def engine_rows(device: str) -> list[Row]:
    label = "TensorRT engine deepspec::greedy_accept"
    if device != "cuda":
        return [Row(label, SKIPPED, "no CUDA device: TensorRT builds and runs engines on a GPU")]
    try:  # TensorRT exists only on a GPU machine's image, never in the checkout's venv
        import tensorrt as trt  # pyright: ignore[reportMissingImports]
        import tensorrt.plugin as trtp  # pyright: ignore[reportMissingImports]
    except ImportError as exc:
        return [Row(label, SKIPPED, f"tensorrt is not importable here ({exc})")]
    import torch
    import triton

    import plugins.tensorrt  # noqa: F401 - registers the deepspec:: plugins
    from plugins.reference import greedy_accept

    drafts, num, logits = _inputs()
    engine = _build_engine(trt, trtp, drafts, num, logits)
    outputs = {
        "num_accepted": torch.empty(B, dtype=torch.int64, device="cuda"),
        "next_token": torch.empty(B, dtype=torch.int64, device="cuda"),
    }
    tensors = {"draft_tokens": drafts, "num_draft_tokens": num, "target_logits": logits, **outputs}
    context = engine.create_execution_context()
    for name, tensor in tensors.items():
        context.set_tensor_address(name, tensor.data_ptr())
    stream = torch.cuda.current_stream()
    if not context.execute_async_v3(stream.cuda_stream):
        raise RuntimeError("execute_async_v3 returned False")
    stream.synchronize()
    want = [t.cpu() for t in greedy_accept(drafts.cpu(), num.cpu(), logits.cpu())]
    got = [outputs["num_accepted"].cpu(), outputs["next_token"].cpu()]
    same = all(torch.equal(a, b) for a, b in zip(got, want))
    where = f"TensorRT {trt.__version__}, triton {triton.__version__}"
    return [
        Row(
            label,
            OK if same else FAIL,
            f"{where}: "
            + (
                "outputs equal the reference"
                if same
                else f"got {[t.tolist() for t in got]}, reference {[t.tolist() for t in want]}"
            ),
        )
    ]


def run(context) -> list[Row]:
    rows = guarded(context, "AOT contract greedy_accept", lambda: contract_rows(context.device))
    return rows + guarded(context, "TensorRT engine deepspec::greedy_accept", lambda: engine_rows(context.device))
