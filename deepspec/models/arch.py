"""The few numbers and switches that tell decoder-only families apart (Llama/SmolLM2, Qwen2, Qwen3, Gemma3).

Derived once from a Hugging Face config, so the fast decoder below needs no per-family subclass. Anything this
does not describe is refused with the list of supported families rather than silently mis-run.
"""

from dataclasses import dataclass, replace

SUPPORTED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")


class AttentionWidths:
    """q/k/v projection widths from `num_heads`, `num_kv_heads` and `head_dim`: shared by the target's ArchSpec and
    the draft's DraftConfig, whose attention layers are built the same way."""

    num_heads: int
    num_kv_heads: int
    head_dim: int

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


@dataclass(frozen=True)
class ArchSpec(AttentionWidths):
    family: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    max_position_embeddings: int
    #: Qwen2: biases on q/k/v projections
    qkv_bias: bool = False
    #: Qwen3/Gemma3: RMSNorm on each head of q and k before RoPE
    qk_norm: bool = False
    #: "silu" (SwiGLU) or "gelu_tanh" (GeGLU, Gemma)
    activation: str = "silu"
    #: Gemma: RMSNorm weights are stored as (w - 1); embeddings are scaled by sqrt(hidden)
    gemma_norms: bool = False
    #: Gemma3: extra norms after attention and MLP, before the residual add
    sandwich_norms: bool = False
    #: softmax scale = attn_scale (default head_dim ** -0.5)
    attn_scale: float = 0.0
    #: per layer: sliding window size (0 = full attention)
    sliding_windows: tuple[int, ...] = ()
    #: RoPE base used on sliding-window layers (Gemma3 uses a smaller local base)
    rope_local_theta: float = 0.0
    #: linear RoPE scaling factor on full-attention layers (1 = none)
    rope_scaling_factor: float = 1.0


def _rope_params(config) -> tuple[float, dict]:
    params = getattr(config, "rope_parameters", None) or {}
    if "full_attention" in params:  # Gemma3 in transformers 5: one entry per attention type
        return float(params["full_attention"].get("rope_theta", 10000.0)), params
    theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    return float(theta), params


def arch_spec_from_config(config) -> ArchSpec:
    """Read an HF `PretrainedConfig` into an ArchSpec; raise ValueError for families we do not run."""
    family = getattr(config, "model_type", "?")
    if family == "gemma3":  # multimodal wrapper: the text config is what decodes
        config = config.text_config
        family = "gemma3_text"
    if family not in SUPPORTED_FAMILIES:
        raise ValueError(
            f"unsupported target architecture '{family}'; the engine runs {', '.join(SUPPORTED_FAMILIES)}. "
            "Pass a Hugging Face directory or GGUF file of one of those families."
        )
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    theta, rope = _rope_params(config)
    base = ArchSpec(
        family=family,
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_layers=config.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        intermediate_size=config.intermediate_size,
        rms_norm_eps=float(config.rms_norm_eps),
        rope_theta=theta,
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        max_position_embeddings=int(getattr(config, "max_position_embeddings", 2048)),
        attn_scale=head_dim**-0.5,
    )
    if getattr(config, "rope_scaling", None) and family != "gemma3_text":
        kind = config.rope_scaling.get("rope_type", config.rope_scaling.get("type"))
        if kind not in (None, "default"):
            raise ValueError(f"RoPE scaling '{kind}' is not supported by the engine yet")
    if family == "qwen2":
        return replace(base, qkv_bias=True)
    if family == "qwen3":
        return replace(base, qk_norm=True)
    if family == "gemma3_text":
        window = int(getattr(config, "sliding_window", 0) or 0)
        layer_types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
        local = rope.get("sliding_attention", {}).get("rope_theta", getattr(config, "rope_local_base_freq", 10000.0))
        full = rope.get("full_attention", {})
        factor = float(full.get("factor", 1.0)) if full.get("rope_type") == "linear" else 1.0
        return replace(
            base,
            attn_scale=float(config.query_pre_attn_scalar) ** -0.5,
            qk_norm=True,
            activation="gelu_tanh",
            gemma_norms=True,
            sandwich_norms=True,
            sliding_windows=tuple(window if t == "sliding_attention" else 0 for t in layer_types),
            rope_local_theta=float(local),
            rope_scaling_factor=factor,
        )
    return base
