"""Resolve a target spec into a loaded `Target`: an alias, GGUF file or Hugging Face directory into a
`DecoderTarget`, a `python -m export --format onnx` directory into an `OnnxTarget`. It is the one loader: the
worker, training and the benchmarks call only `load_target`.

GGUF files are dequantized once by transformers and the result is cached as safetensors + tokenizer under
`~/.cache/deepspec/targets/`, so every later load reads plain tensors in seconds. With `quantization="gguf"` the
matmuls whose GGUF weights are 4-bit keep them 4-bit (deepspec/models/gguf_int4.py); the rest stays dense.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch

from deepspec.models.aliases import ALIASES, DEFAULT_TARGET
from deepspec.models.arch import arch_spec_from_config
from deepspec.models.chat_templates import require_chat_template, resolve_chat_template
from deepspec.models.decoder import Decoder
from deepspec.models.decoder_target import DecoderTarget
from deepspec.models.onnx_target import OnnxTarget, is_onnx_export, load_onnx_target
from deepspec.models.quantization import QUANTIZATIONS
from deepspec.paths import cache_dir

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype '{dtype}'; choose one of {sorted(DTYPES)}") from None


def resolve_target_dir(spec: str) -> tuple[str, Path, Path | None]:
    """Alias | *.gguf | HF directory → (display name, directory with config.json + safetensors, GGUF or None)."""
    if spec in ALIASES:
        gguf = ALIASES[spec].locate()
        return spec, _materialize_gguf(gguf), gguf
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {path}")
        return path.stem, _materialize_gguf(path), path
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} is not a Hugging Face model directory (no config.json)")
        return path.name, path, None
    raise ValueError(
        f"unknown target '{spec}': pass an alias ({', '.join(ALIASES)}; default {DEFAULT_TARGET}), "
        "a .gguf file, or a Hugging Face model directory"
    )


def _materialize_gguf(gguf: Path) -> Path:
    stat = gguf.stat()
    out = cache_dir() / "targets" / f"{gguf.stem}-{stat.st_size:x}"
    if (out / "config.json").is_file():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".tmp-"))
    try:
        _save_dequantized(model, tmp)
        tokenizer.save_pretrained(tmp)
        tmp.rename(out)  # atomic: a concurrent loader either sees the whole directory or none
    except OSError:
        if not (out / "config.json").is_file():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _save_dequantized(model, out: Path) -> None:
    """save_pretrained refuses GGUF-quantized models; the dequantized tensors are plain, so write them directly."""
    import json

    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out)


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if files:
        state: dict[str, torch.Tensor] = {}
        for f in files:
            state.update(load_file(f))
        return state
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()


def _int4_blocker(device: str, dtype: torch.dtype) -> str | None:
    """Why quantization 'gguf' cannot run on this device and dtype, or None when it can."""
    from deepspec.models.packed_linear import int4_supported

    if not int4_supported(device):
        return f"quantization 'gguf' runs 4-bit matmuls on CPU only, not on '{device}'; use --quantization none there"
    if dtype != torch.bfloat16:
        return (
            "quantization 'gguf' needs --dtype bfloat16: torch's int4 CPU kernel is fast only for bf16 "
            "activations (float32 runs ~10x slower than dense)"
        )
    return None


def _load_onnx_export(
    path: str, max_seq_len: int | None, quantization: str, chat_template: str | None, for_chat: bool
) -> OnnxTarget:
    """A `python -m export --format onnx` directory: its graph runs on ONNX Runtime's CPU provider with float32
    activations and the weights stored as they were exported (onnx.json `quantization`), whatever the caller's
    dtype and device; asking for 4-bit GGUF matmuls on it is refused, since its weights are fixed at export."""
    if quantization == "gguf":
        raise ValueError(
            f"{path} is an ONNX export, whose weights keep the quantization it was exported with: "
            "drop --quantization gguf (python -m export --format onnx --quantization int4 exports 4-bit "
            "weights)"
        )
    return load_onnx_target(path, max_seq_len=max_seq_len, chat_template=chat_template, for_chat=for_chat)


def load_target(
    spec: str = DEFAULT_TARGET,
    *,
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    max_seq_len: int | None = None,
    quantization: str | None = None,
    chat_template: str | None = None,
    for_chat: bool = False,
) -> DecoderTarget | OnnxTarget:
    """Load a target for decoding; `max_seq_len` caps the context (default: the model's own); `quantization`
    is one of QUANTIZATIONS (default "none"); `chat_template` (a built-in name or a Jinja file,
    deepspec/models/chat_templates.py) replaces the tokenizer's own, for targets that ship none. `for_chat`: the
    caller renders every prompt as chat, so a target left without a template is refused here, before the weights
    load, with the one-line MissingChatTemplateError. An ONNX export directory runs as exported (_load_onnx_export):
    `dtype` and `device` do not apply to it."""
    from transformers import AutoConfig, AutoTokenizer

    from deepspec.models.gguf_int4 import cached_int4_weights

    torch_dtype = parse_dtype(dtype)
    quantization = quantization or "none"
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization '{quantization}'; choose one of {', '.join(QUANTIZATIONS)}")
    if is_onnx_export(spec):
        return _load_onnx_export(spec, max_seq_len, quantization, chat_template, for_chat)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device '{device}' requested but no CUDA GPU is visible to torch; use --device cpu")
    int4_blocker = _int4_blocker(device, torch_dtype)
    if quantization == "gguf" and int4_blocker:
        raise ValueError(int4_blocker)
    name, path, gguf = resolve_target_dir(spec)
    if quantization == "auto":
        quantization = "gguf" if gguf is not None and not int4_blocker else "none"
    if quantization == "gguf" and gguf is None:
        raise ValueError(
            f"quantization 'gguf' needs a GGUF target (an alias or a .gguf file); '{spec}' is a Hugging Face directory"
        )
    config = AutoConfig.from_pretrained(path)
    arch = arch_spec_from_config(config)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if chat_template is not None:
        tokenizer.chat_template = resolve_chat_template(chat_template)
    if for_chat:
        require_chat_template(tokenizer, name, arch.family)
    limit = min(max_seq_len or arch.max_position_embeddings, arch.max_position_embeddings)
    model = Decoder(arch, max_positions=limit)
    state = _read_state_dict(path)
    model.load_hf_state_dict(state, torch_dtype)
    model = model.to(device).eval()
    if quantization == "gguf" and gguf is not None and model.use_int4(cached_int4_weights(gguf, path, state)) == 0:
        raise ValueError(f"{gguf.name} has no 4-bit (Q4_0, Q4_1, Q4_K) matmul weights; use --quantization none")
    del state
    model.prepack()
    eos = config.eos_token_id if not hasattr(config, "text_config") else config.text_config.eos_token_id
    eos_ids = {*([eos] if isinstance(eos, int) else (eos or [])), tokenizer.eos_token_id}
    try:
        from transformers import GenerationConfig

        gen_eos = GenerationConfig.from_pretrained(path).eos_token_id
        eos_ids |= {*([gen_eos] if isinstance(gen_eos, int) else (gen_eos or []))}
    except OSError:
        pass
    eos_ids.discard(None)
    return DecoderTarget(name, path, config, arch, model, tokenizer, limit, tuple(sorted(eos_ids)), quantization)
