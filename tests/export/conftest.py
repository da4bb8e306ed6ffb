"""Tiny Hugging Face targets of every family the exporters convert (Llama, Qwen2, Qwen3, Gemma3) and random drafts
trained for them, written to disk in milliseconds so exports run the real code paths on real directories."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
FAMILIES = ("llama", "qwen2", "qwen3", "gemma3_text")
#: sizes for write_hf_target where ONNX Runtime runs the target: its GroupQueryAttention wants head_dim % 16 == 0
HD16: dict[str, Any] = dict(hidden_size=64, head_dim=16, intermediate_size=128)


def _config(family: str, vocab_size: int, eos: int):
    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=eos,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    if family == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(**common)
    if family == "qwen2":
        from transformers import Qwen2Config

        return Qwen2Config(**common)
    if family == "qwen3":
        from transformers import Qwen3Config

        return Qwen3Config(**common, head_dim=8)
    if family == "gemma3_text":
        from transformers import Gemma3TextConfig

        return Gemma3TextConfig(**common, head_dim=8, sliding_window=64, query_pre_attn_scalar=8)
    raise ValueError(family)


#: the character tokenizer's chat template (ChatML): a target that ships one, as the exported ones mostly do
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_hf_target(
    path: Path,
    family: str = "llama",
    seed: int = 0,
    tied: bool = False,
    chat_template: str | None = CHAT_TEMPLATE,
    **config,
) -> Path:
    """A loadable HF directory: random weights of `family` and a character tokenizer (vocab 128) with
    `chat_template` (None: a target that ships none, as gemma3-270m); `config` overrides sizes (hidden_size=64 gives
    head_dim 16, what ONNX Runtime's attention kernel takes)."""
    from tokenizers import Tokenizer, models
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    specials = ["<unk>", "<|im_start|>", "<|im_end|>"]
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    vocab.update({f"<extra_{i}>": len(vocab) + i for i in range(128 - len(vocab))})
    fast = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>")),
        unk_token="<unk>",
        eos_token="<|im_end|>",
    )
    fast.chat_template = chat_template
    hf_config = _config(family, 128, vocab["<|im_end|>"])
    hf_config.tie_word_embeddings = tied
    for key, value in config.items():
        setattr(hf_config, key, value)
    config = hf_config
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return path


def write_draft(
    path: Path, target_dir: Path, algo: str = "eagle3", draft_vocab_size: int = 48, seed: int = 0, **overrides
) -> Path:
    """A random draft of `algo` for the target at target_dir, saved as python -m training saves one."""
    from deepspec.models import load_target
    from deepspec.models.drafts import DraftConfig, build_draft, save_draft

    target = load_target(str(target_dir))
    overrides.setdefault("feature_layers", (1, 2, 3))
    cfg = DraftConfig.for_target(target, algo, draft_vocab_size=draft_vocab_size, block_size=4, **overrides)
    torch.manual_seed(seed)
    draft = build_draft(cfg)
    with torch.no_grad():
        for p in draft.parameters():
            p.normal_(0, 0.2)
    if draft_vocab_size:
        g = torch.Generator().manual_seed(seed)
        draft.set_vocab(torch.randperm(cfg.vocab_size, generator=g)[:draft_vocab_size].sort().values)
    return save_draft(draft, path)


@pytest.fixture(scope="session")
def targets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("targets")
    return {family: write_hf_target(root / family, family) for family in FAMILIES}


@pytest.fixture(scope="session")
def drafts(tmp_path_factory, targets) -> dict[tuple[str, str], Path]:
    """(family, algo) -> a draft; eagle3 drafts capture 3 layers (the engines' count), dflash/dspark 3 as well."""
    root = tmp_path_factory.mktemp("drafts")
    out = {}
    for family, target_dir in targets.items():
        for algo in ("eagle3", "dflash", "dspark"):
            out[family, algo] = write_draft(root / f"{family}-{algo}", target_dir, algo)
    return out


def run_export(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m export ARGS` in this process (the import cost of a subprocess is seconds): exit code, stdout,
    stderr as the command line would give them."""
    import contextlib
    import io

    from export.cli import main
    from export.progress import quiet

    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main([str(a) for a in args], progress=quiet())
        except SystemExit as e:  # argparse exits with an int code
            assert isinstance(e.code, int), e.code
            code = e.code
    return subprocess.CompletedProcess(
        ["python", "-m", "export", *map(str, args)], code, stdout.getvalue(), stderr.getvalue()
    )


def run_export_process(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    """The real command line in a subprocess (for the few tests about the process itself)."""
    return subprocess.run(
        [sys.executable, "-m", "export", *map(str, args)], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
