"""The check's own target: a Llama of the chosen shapes with seeded random weights, saved as a Hugging Face
directory (safetensors, config, tokenizer with a ChatML template) and loaded through `load_target`'s HF-directory
path, exactly as a user's model directory is.

The GPU machine has no network and no `gguf`, and the default target's GGUF cannot travel with the checkout, so
the check builds what it runs. The tokenizer is one token per printable character plus filler tokens up to the
model's vocabulary (`<x123>`), so every id the random model emits decodes to text.

The final norm's weight is scaled by LOGIT_SCALE: a random Llama's logits are nearly flat (std ≈ 0.5 over 49,152
tokens, top-2 gaps of ~0.1), where fp32 rounding differences between a 1-token decode and a k+1-token verify pass
could flip an argmax and fail the greedy identity for a reason that is not a bug. Scaled, the gaps are ~20x wider;
the shapes, and so the speed, are unchanged.
"""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ("<unk>", "<|im_start|>", "<|im_end|>")
LOGIT_SCALE = 20.0


def _tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    tokens = list(SPECIAL_TOKENS) + chars
    if vocab_size < len(tokens):
        raise ValueError(f"the generated tokenizer needs a vocabulary of at least {len(tokens)}, got {vocab_size}")
    tokens += [f"<x{i}>" for i in range(len(tokens), vocab_size)]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    fast = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>")),
        unk_token="<unk>",
        eos_token="<|im_end|>",
        additional_special_tokens=list(SPECIAL_TOKENS[1:]),
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast, vocab["<|im_end|>"]


def write_target_dir(path: Path, config_kwargs: dict, seed: int = 0, family: str = "llama") -> Path:
    """A loadable Hugging Face directory of a random `family` model (llama, or qwen3: q/k-norm) with
    `config_kwargs` (that config class's fields)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}
    if family not in classes:
        raise ValueError(f"unknown target family {family!r}; known: {', '.join(classes)}")
    config_class, model_class = classes[family]
    tokenizer, eos_id = _tokenizer(config_kwargs["vocab_size"])
    config = config_class(**config_kwargs, eos_token_id=eos_id, bos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    model = model_class(config).eval()
    with torch.no_grad():
        model.model.norm.weight.mul_(LOGIT_SCALE)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def chat_prompts(target, texts: list[str], max_chars: int) -> list[list[int]]:
    """Each text (cut to `max_chars`) as one user turn through the target's chat template."""
    return [target.encode_chat([{"role": "user", "content": text[:max_chars]}]) for text in texts]


def prompt_texts(count: int) -> list[str]:
    """The first turns of the shipped eval sets, code and math interleaved (HumanEval, GSM8K)."""
    import json

    from deepspec.paths import eval_dataset

    sets = []
    for name in ("humaneval", "gsm8k"):
        with eval_dataset(name).open() as f:
            sets.append([json.loads(line)["turns"][0] for _, line in zip(range(count), f)])
    texts = [t for pair in zip(*sets) for t in pair]
    return texts[:count]
