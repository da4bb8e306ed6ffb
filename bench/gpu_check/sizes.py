"""Every size the check runs at, from one dial: FULL (one GPU, ≤ 8 minutes) or QUICK (`--quick`: every part at
tiny sizes on 2 CPU cores in seconds, what tests/bench/test_gpu_check.py runs so the script cannot rot).

FULL's target has SmolLM2-135M's shapes (the default target's real config) with seeded random weights: speed is a
property of the shapes, and greedy identity holds for any weights. Each part has a wall-clock budget; a part that
spends it skips its remaining rows (each says so) instead of running past the check's 8 minutes. QUICK's budgets
are generous: on a loaded CPU the load, not the sizes, sets the pace, and its budgets are only there to end a hang.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

#: SmolLM2-135M-Instruct's config.json (the shapes that set its speed): Llama, tied embeddings, head_dim 64
SMOLLM2_135M = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)
#: a Llama small enough for milliseconds per step; head_dim 16, the smallest ONNX Runtime's attention kernel takes
TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)


@dataclass(frozen=True)
class Sizes:
    name: str
    #: LlamaConfig keyword arguments of the generated target
    target: dict
    #: prompts decoded together (one batch) by every fp32 greedy and temperature-1 run
    num_prompts: int
    #: prompt text is cut to this many characters (the generated tokenizer is one token per character)
    max_prompt_chars: int
    #: tokens per request in the fp32 runs
    max_new_tokens: int
    #: prompts decoded one at a time (batch 1) for bf16 tokens/s, ours and Hugging Face generate's
    num_speed_prompts: int
    max_speed_tokens: int
    num_speculative_tokens: int
    num_train_steps: int
    train_max_len: int
    #: kernels compiled ahead of time with the installed triton (None: every kernel)
    max_kernel_compiles: int | None
    #: wall-clock budget per part, seconds (FULL: 440 in all, leaving 10 s of the total for building the target;
    #: `make`'s install and the imports fit in the 30 s the total leaves below 8 minutes)
    budget_seconds: dict
    #: the whole check's limit from the target's build on: a part's process is killed when it would run past it,
    #: and a part not yet started is skipped (FULL: 450, so that with the imports and `make`'s install it stays
    #: within 8 minutes)
    total_seconds: float

    def as_dict(self) -> dict:
        return asdict(self)


FULL = Sizes(
    "full",
    SMOLLM2_135M,
    num_prompts=8,
    max_prompt_chars=240,
    max_new_tokens=64,
    num_speed_prompts=3,
    max_speed_tokens=64,
    num_speculative_tokens=7,
    num_train_steps=20,
    train_max_len=512,
    max_kernel_compiles=None,
    budget_seconds={"kernels": 120, "engine": 140, "training": 60, "onnx": 30, "tensorrt": 30, "vllm": 60},
    total_seconds=450,
)
QUICK = Sizes(
    "quick",
    TINY,
    num_prompts=3,
    max_prompt_chars=40,
    max_new_tokens=8,
    num_speed_prompts=1,
    max_speed_tokens=8,
    num_speculative_tokens=3,
    num_train_steps=2,
    train_max_len=96,
    max_kernel_compiles=1,
    budget_seconds={"kernels": 600, "engine": 600, "training": 600, "onnx": 600, "tensorrt": 600, "vllm": 600},
    total_seconds=3600,
)
