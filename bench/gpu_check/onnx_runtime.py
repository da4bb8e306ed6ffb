"""Part `onnx`: the check's target exported to ONNX (export/onnx/graph.py, fp32, the graph the DeepSpec worker
serves) and run by ONNX Runtime's CUDA provider where this onnxruntime build has one.

One prefill of a prompt through the graph, every position's logits against our PyTorch decoder in fp32: the
argmax must agree everywhere and the largest difference stay within MAX_RELATIVE_ERROR of the largest logit. A
CPU-only onnxruntime build (the usual pip wheel) has no CUDA provider: that row is `skipped` with the reason and
the graph still runs on the CPU provider, so the export itself is checked either way.
"""

from __future__ import annotations

import time

from bench.gpu_check.report import FAIL, OK, SKIPPED, Row
from bench.gpu_check.target import chat_prompts, prompt_texts

CUDA_PROVIDER = "CUDAExecutionProvider"
#: the largest |logit difference| allowed, relative to the largest |logit| (fp32 on both sides)
MAX_RELATIVE_ERROR = 1e-3


def graph_inputs(spec, tokens):
    """The graph's inputs for one prefill of `tokens` [1, T] with an empty past (export/onnx/graph.py's names)."""
    import numpy as np

    T = tokens.shape[1]
    feeds = {
        "input_ids": tokens.astype(np.int64),
        "seqlens_k": np.array([T - 1], dtype=np.int32),
        "total_sequence_length": np.array(T, dtype=np.int32),
        "logits_index": np.arange(T, dtype=np.int64)[None, :],
    }
    past = np.zeros((1, spec.num_kv_heads, T, spec.head_dim), dtype=np.float32)
    for i in range(spec.num_layers):
        feeds[f"past_key.{i}"] = past
        feeds[f"past_value.{i}"] = past
    return feeds


def compare_row(session, target, tokens, provider: str) -> Row:
    import numpy as np
    import torch

    t0 = time.perf_counter()
    got = session.run(["logits"], graph_inputs(target.spec, tokens.numpy()))[0]
    seconds = time.perf_counter() - t0
    with torch.inference_mode():
        want = target.forward(tokens, torch.zeros(1, dtype=torch.long), logits="all").logits.float().numpy()
    err = float(np.abs(got - want).max())
    scale = float(np.abs(want).max())
    argmax_agree = float((got.argmax(-1) == want.argmax(-1)).mean())
    ok = argmax_agree == 1.0 and err <= MAX_RELATIVE_ERROR * scale
    return Row(
        f"prefill logits on {provider}",
        OK if ok else FAIL,
        f"providers {session.get_providers()}; vs PyTorch fp32 over {tokens.shape[1]} positions",
        {
            "max_abs_err": err,
            "max_abs_logit": round(scale, 3),
            "argmax_agree": argmax_agree,
            "run_s": round(seconds, 3),
        },
    )


def run(context) -> list[Row]:
    import onnxruntime as ort
    import torch

    from deepspec.models import load_target, pytorch_decoder
    from export.onnx.graph import build_target_graph

    target = load_target(str(context.target_dir), dtype="float32", device="cpu")
    out = context.workdir / "onnx"
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    graph = build_target_graph(pytorch_decoder(target), (), out)
    rows = [Row("export target.onnx (fp32)", OK, "", {"export_s": round(time.perf_counter() - t0, 1)})]
    tokens = torch.tensor([chat_prompts(target, prompt_texts(1), context.sizes.max_prompt_chars)[0]])
    available = ort.get_available_providers()
    if CUDA_PROVIDER in available and context.device == "cuda":
        session = ort.InferenceSession(str(graph), providers=[CUDA_PROVIDER, "CPUExecutionProvider"])
        rows.append(compare_row(session, target, tokens, CUDA_PROVIDER))
    else:
        why = (
            f"onnxruntime {ort.__version__} has no {CUDA_PROVIDER} (providers: {', '.join(available)})"
            if CUDA_PROVIDER not in available
            else "no CUDA device"
        )
        rows.append(Row(f"prefill logits on {CUDA_PROVIDER}", SKIPPED, why))
    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    rows.append(compare_row(session, target, tokens, "CPUExecutionProvider"))
    return rows
