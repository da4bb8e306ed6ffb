"""Part `vllm`: does vLLM load a Qwen3-style (q/k-norm) EAGLE-3 draft that `python -m export --format vllm` wrote
in the speculators format, and speculate with it?

The export writes such a draft with `transformer_layer_config.model_type: qwen3` (export/drafts/eagle3.py); whether
vLLM's speculators path builds its q/k-norm layer from that, rather than a Llama layer that drops the norms, is read
nowhere but on a GPU. Rows:

- `export qwen3 q/k-norm eagle3 (speculators)`: a tiny random Qwen3 target and a random 3-layer-feature EAGLE-3
  draft for it, exported for vLLM (runs without a GPU);
- `vllm serves the speculators draft`: `vllm.LLM(model=<draft dir>)` (the speculators config names its target),
  greedy generation of a few tokens with the draft proposing, and vLLM's own count of proposed draft tokens.
"""

from __future__ import annotations

from bench.gpu_check.context import guarded
from bench.gpu_check.report import FAIL, OK, SKIPPED, Row

#: the tiny target: Qwen3 with q/k-norm, head_dim 64 (what vLLM's attention backends take)
QWEN3 = dict(
    vocab_size=512,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=1024,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)
NUM_SPECULATIVE_TOKENS = 3


def export_rows(workdir) -> tuple[list[Row], object]:
    """The export row and the exported draft directory (None when it failed)."""
    import json

    import torch

    from bench.gpu_check.target import write_target_dir
    from deepspec.models import load_target
    from deepspec.models.drafts import DraftConfig, build_draft, save_draft
    from export.cli import main as export_main
    from export.progress import quiet

    target_dir = write_target_dir(workdir / "qwen3-target", QWEN3, family="qwen3")
    target = load_target(str(target_dir))
    cfg = DraftConfig.for_target(target, "eagle3", feature_layers=(1, 3, 5), draft_vocab_size=0)
    torch.manual_seed(0)
    draft_dir = save_draft(build_draft(cfg), workdir / "qwen3-eagle3")
    out = workdir / "qwen3-eagle3-vllm"
    code = export_main(
        [
            "--target",
            str(target_dir),
            "--draft",
            str(draft_dir),
            "--format",
            "vllm",
            "--dtype",
            "bfloat16",
            "--num-speculative-tokens",
            str(NUM_SPECULATIVE_TOKENS),
            "--out",
            str(out),
            "--force",
        ],
        progress=quiet(),
    )
    label = "export qwen3 q/k-norm eagle3 (speculators)"
    if code != 0:
        return [Row(label, FAIL, f"python -m export exited {code}")], None
    config = json.loads((out / "draft" / "config.json").read_text())
    layer = config["transformer_layer_config"]
    ok = layer["model_type"] == "qwen3" and cfg.qk_norm
    return [
        Row(
            label,
            OK if ok else FAIL,
            f"model_type {layer['model_type']}, q/k-norm {cfg.qk_norm}, "
            f"aux layers {config['eagle_aux_hidden_state_layer_ids']}",
        )
    ], out / "draft"


def serve_rows(device: str, draft_dir) -> list[Row]:
    label = "vllm serves the speculators draft"
    if device != "cuda":
        return [Row(label, SKIPPED, "no CUDA device: vLLM serves on a GPU")]
    if draft_dir is None:
        return [Row(label, SKIPPED, "the export row failed")]
    try:  # vLLM exists only on a GPU machine's image, never in the checkout's venv
        import vllm  # pyright: ignore[reportMissingImports]
    except ImportError as exc:
        return [Row(label, SKIPPED, f"vllm is not importable here ({exc})")]
    llm = vllm.LLM(
        model=str(draft_dir), dtype="bfloat16", max_model_len=512, gpu_memory_utilization=0.3, enforce_eager=True
    )
    params = vllm.SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    out = llm.generate(["<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"], params)[0].outputs[0]
    drafted = _metric(llm, "vllm:spec_decode_num_draft_tokens")
    ok = len(out.token_ids) == 16 and drafted > 0
    return [
        Row(
            label,
            OK if ok else FAIL,
            f"vllm {vllm.__version__}: {len(out.token_ids)} tokens, {drafted:.0f} draft tokens proposed",
            {"draft_tokens": drafted},
        )
    ]


def _metric(llm, name: str) -> float:
    """A counter of vLLM's own metrics (`LLM.get_metrics`), 0 when this release does not report it."""
    try:
        return float(sum(getattr(m, "value", 0) or 0 for m in llm.get_metrics() if m.name == name))
    except AttributeError:
        return 0.0


def run(context) -> list[Row]:
    state = {}

    def export():
        rows, state["draft"] = export_rows(context.workdir)
        return rows

    rows = guarded(context, "export qwen3 q/k-norm eagle3 (speculators)", export)
    return rows + guarded(
        context, "vllm serves the speculators draft", lambda: serve_rows(context.device, state.get("draft"))
    )
