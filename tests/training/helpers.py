"""Tiny in-memory things for draft and training tests: a random-init target (milliseconds per step) whose
tokenizer has a fingerprint, and hand-made token sequences with assistant loss masks."""

from __future__ import annotations

from typing import cast

import torch
from transformers import PreTrainedTokenizerBase

from tests.conftest import CharTokenizer, make_tiny_target


class FingerprintedCharTokenizer(CharTokenizer):
    def get_vocab(self) -> dict[str, int]:
        return {chr(33 + i): i for i in range(self.vocab_size)}


def tiny_target(vocab_size: int = 64, hidden: int = 32, layers: int = 4, seed: int = 0, temperature: float = 4.0):
    target, _ = make_tiny_target(
        vocab_size=vocab_size, hidden=hidden, layers=layers, seed=seed, eos=False, temperature=temperature
    )
    target.tokenizer = cast(PreTrainedTokenizerBase, FingerprintedCharTokenizer(vocab_size))  # what the tests read
    return target


def tiny_draft(target, algo: str, **overrides):
    from deepspec.models.drafts import DraftConfig, build_draft

    overrides.setdefault("feature_layers", (0, 1, 2))
    overrides.setdefault("block_size", 4)
    cfg = DraftConfig.for_target(target, algo, **overrides)
    torch.manual_seed(0)
    return build_draft(cfg).attach(target)


def target_sequences(target, num: int, length: int, seed: int = 0) -> list[list[int]]:
    """Greedy continuations of random prompts by the target itself (what prepare produces), as token lists."""
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for _ in range(num):
        tokens = torch.randint(target.vocab_size, (1, 3), generator=g)
        while tokens.shape[1] < length:
            out = target.forward(tokens, torch.zeros(1, dtype=torch.long), logits="last")
            tokens = torch.cat([tokens, out.logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        seqs.append(tokens[0].tolist())
    return seqs


CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_hf_target_dir(path, seed: int = 0, chat_template: str | None = CHAT_TEMPLATE):
    """A loadable Hugging Face directory (random tiny Llama + a character tokenizer with a ChatML template, or
    none with `chat_template=None`), so `load_target(str(path))`, the CLI and torchrun subprocesses see a real
    target in milliseconds."""
    from pathlib import Path

    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path = Path(path)
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    specials = ["<unk>", "<|im_start|>", "<|im_end|>"]
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", eos_token="<|im_end|>", additional_special_tokens=specials[1:]
    )
    fast.chat_template = chat_template
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        eos_token_id=vocab["<|im_end|>"],
        bos_token_id=None,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # a peaky target, so a few steps of training visibly help
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return path


def write_conversations(path, rows: int = 6, seed: int = 0):
    import json
    import random

    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "sum", "def f(x):", "return x + 1", "print(3)"]
    with open(path, "w") as f:
        for i in range(rows):
            answer = " ".join(rng.choice(words) for _ in range(8))
            f.write(
                json.dumps(
                    {
                        "id": f"t:{i}",
                        "conversations": [
                            {"role": "user", "content": f"question {i}?"},
                            {"role": "assistant", "content": answer},
                        ],
                    }
                )
                + "\n"
            )
    return path


def tear_gzip(path, partial_line: str) -> None:
    """Leave `path` (.jsonl.gz) as a writer killed mid-member does: `partial_line` appended in a new gzip member that
    was flushed but never closed (no end of stream, no trailer)."""
    import gzip
    from pathlib import Path

    path = Path(path)
    with gzip.open(path, "at", encoding="utf-8") as f:
        f.write(partial_line)
        f.flush()
        torn = path.read_bytes()
    path.write_bytes(torn)


def attached_draft_case(algo: str, logits: str):
    """A tiny target, a draft of `algo` over a 40-token vocabulary attached to it, two of its sequences with the
    first 3 positions masked out, and its forward over them (features of layers 0-2, final hidden, `logits`):
    → (target, draft, seqs, mask, out)."""
    target = tiny_target()
    draft = tiny_draft(target, algo, draft_vocab_size=40)
    draft.set_vocab(torch.arange(3, 43))
    draft.attach(target)
    seqs = torch.tensor(target_sequences(target, 2, 16))
    mask = torch.ones_like(seqs)
    mask[:, :3] = 0
    out = target.forward(
        seqs, torch.zeros(2, dtype=torch.long), feature_layers=(0, 1, 2), logits=logits, return_final_hidden=True
    )
    return target, draft, seqs, mask, out
