"""The draft configuration: one dataclass for the built-in algorithms, written to config.json beside the weights.

Sizes derive from the target (`DraftConfig.for_target`), so the same recipe works for Llama/SmolLM2, Qwen2/3 and
Gemma3 targets; the target fingerprint travels with it so a draft refuses a target it was not trained on. What
differs per algorithm (which names are algorithms, their default depth and tensor layouts, a config class of their
own) is the algorithm's record (deepspec/algorithms): `for_target` and `from_dict` build the config class it names.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from deepspec.algorithms import check_layout, load_part, resolve_algorithm
from deepspec.models.arch import AttentionWidths


def canonical_feature_layers(num_target_layers: int) -> tuple[int, ...]:
    """The 3 captured layers every EAGLE-3 engine uses by default, as our `feature_layers` ids ("output of layer
    i", i.e. Hugging Face `hidden_states[i + 1]`): {1, L//2 - 1, L - 4}. vLLM and SGLang write the same tensors as
    (2, L//2, L - 3) ("entering layer i" = `hidden_states[i]`); SmolLM2-135M (L = 30): ours (1, 14, 26)."""
    L = num_target_layers
    layers = (1, L // 2 - 1, L - 4)
    if L < 8:
        raise ValueError(
            f"the engines' default EAGLE-3 layers need a target of >= 8 layers (this one has {L}); "
            "pass feature_layers explicitly"
        )
    return layers


def check_feature_layer_order(feature_layers, name: str = "feature_layers") -> None:
    """ValueError unless the captured layers are strictly ascending. Our drafts concatenate the features in the
    configured order, but the engines do not keep it: TensorRT-LLM sorts and de-duplicates
    `eagle3_layers_to_capture` (tensorrt_llm/_torch/speculative/eagle3.py `Eagle3OneModelSpecMetadata.__post_init__`,
    1.2.1), vLLM and SGLang append each captured layer as their decoder loop passes it (vllm
    model_executor/models/llama.py `LlamaModel.forward`; sglang srt/models/llama.py `LlamaModel.forward`). Any other
    order feeds the draft's `fc` its inputs permuted, and a repeat shrinks them: wrong drafts, no error."""
    layers = [int(i) for i in feature_layers]
    if any(b <= a for a, b in zip(layers, layers[1:])):
        raise ValueError(
            f"{name} {layers} must be strictly ascending with no repeats: the engines capture target "
            "layers in layer order (TensorRT-LLM also sorts and de-duplicates them), so this order would "
            f"feed the draft's fc permuted inputs; list them as {sorted(set(layers))} and train the draft "
            "with that order"
        )


@dataclass
class DraftConfig(AttentionWidths):
    #: the draft algorithm (deepspec.algorithms.available_algorithms(): eagle3, dflash, dspark built in)
    algo: str
    #: target family (llama, qwen2, qwen3, gemma3_text): decides qk-norm, qkv bias and MLP activation
    family: str
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    #: full target vocabulary size (the frozen embedding/head rows)
    vocab_size: int
    #: target layers whose residual outputs are concatenated into the draft's input feature (5 by default)
    feature_layers: tuple[int, ...]
    #: draft decoder layers (eagle3: 1; dflash/dspark: 2-3 on small targets, 5 in DeepSpec; the algorithm's
    #: `default_num_layers` when training does not say)
    num_layers: int = 1
    #: block size / TTT unroll length γ
    block_size: int = 7
    #: 0 = the full vocabulary; else the size of the reduced draft vocabulary (vocab_map.safetensors)
    draft_vocab_size: int = 0
    #: dspark: rank r of the Markov head (DeepSpec 256; 64 for small targets)
    markov_rank: int = 64
    #: dspark: default survival threshold of dynamic truncation (stop where Π c < threshold)
    confidence_threshold: float = 0.1
    #: dspark: per-position temperature of the confidence logits (1 = uncalibrated); fitted at the end of training on
    #: held-out rows (training/calibration.py)
    confidence_temperature: tuple[float, ...] = ()
    #: dflash/dspark block layout: slot j predicts x[a+1+j] from [anchor, MASK × (γ-1)]
    block_layout: str = "anchor-first"
    qk_norm: bool = False
    qkv_bias: bool = False
    activation: str = "silu"
    #: tensor layout, one of the algorithm's `layouts`: "deepspec" (the shipped drafts: flat names, the target's
    #: frozen head) or, for eagle3, "canonical" (the EAGLE-3 layout SGLang, vLLM and TensorRT-LLM load: Llama-style
    #: layer, own lm_head, 3 features; see Eagle3Draft)
    layout: str = "deepspec"
    #: eagle3: the layer's residual is hidden_norm(h) instead of h (speculators' flag; the engines' EAGLE-3 and our
    #: drafts use false)
    norm_before_residual: bool = False
    #: target fingerprint (architecture, hidden_size, num_layers, vocab_size, tokenizer_hash)
    target: dict = field(default_factory=dict)

    @property
    def feature_size(self) -> int:
        return len(self.feature_layers) * self.hidden_size

    @property
    def out_vocab_size(self) -> int:
        return self.draft_vocab_size or self.vocab_size

    @classmethod
    def for_target(cls, target, algo: str, **overrides) -> DraftConfig:
        """A config of `algo` sized from the target, as the algorithm's config class; `overrides` set fields."""
        algorithm = _algorithm(algo)
        cls = load_part(algorithm.config)
        spec = target.spec
        num_layers = overrides.pop("num_layers", None) or algorithm.default_num_layers
        canonical = overrides.get("layout") == "canonical"
        feature_layers = overrides.pop("feature_layers", None)
        if not feature_layers:  # the spacing repeats the last layer on a shallow target: keep each layer once
            feature_layers = sorted(
                set(canonical_feature_layers(spec.num_layers) if canonical else target.default_feature_layers(5))
            )
        feature_layers = tuple(feature_layers)
        cfg = cls(
            algo=algo,
            family=spec.family,
            hidden_size=spec.hidden_size,
            num_heads=spec.num_heads,
            num_kv_heads=spec.num_kv_heads,
            head_dim=spec.head_dim,
            intermediate_size=spec.intermediate_size,
            rms_norm_eps=spec.rms_norm_eps,
            rope_theta=spec.rope_theta,
            vocab_size=spec.vocab_size,
            feature_layers=feature_layers,
            num_layers=num_layers,
            qk_norm=spec.qk_norm,
            qkv_bias=spec.qkv_bias,
            activation=spec.activation,
            target=target.fingerprint(),
        )
        if canonical:  # a Llama-style layer whatever the target family: what every engine's EAGLE-3 loader builds
            cfg.qk_norm, cfg.qkv_bias, cfg.activation = False, False, "silu"
        for key, value in overrides.items():
            if not hasattr(cfg, key):
                raise ValueError(f"unknown draft setting '{key}'; known: {[f.name for f in fields(cls)]}")
            setattr(cfg, key, value)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        _algorithm(self.algo)
        if self.num_layers < 1 or self.block_size < 1:
            raise ValueError("num_layers and block_size must be >= 1")
        if not 0 <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size must be in [0, {self.vocab_size}], got {self.draft_vocab_size}")
        if self.block_layout != "anchor-first":
            raise ValueError(f"unsupported block layout '{self.block_layout}' (this engine runs 'anchor-first')")
        check_layout(self.algo, self.layout)
        check_feature_layer_order(self.feature_layers)
        if self.layout == "canonical":
            if len(self.feature_layers) != 3:
                raise ValueError(
                    f"the canonical EAGLE-3 layout takes 3 captured layers (fc: 3*H -> H), got "
                    f"{list(self.feature_layers)}"
                )
            if self.num_layers != 1 or self.qk_norm or self.qkv_bias or self.activation != "silu":
                raise ValueError(
                    "the canonical EAGLE-3 layout is one Llama-style layer: num_layers 1, no q/k-norm, "
                    "no qkv bias, silu MLP"
                )

    def to_dict(self) -> dict:
        d = asdict(self)
        d["feature_layers"] = list(self.feature_layers)
        d["confidence_temperature"] = list(self.confidence_temperature)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> DraftConfig:
        """config.json's keys (no storage metadata) → the config class of its `algo`; unknown keys are errors."""
        cls = config_class(d.get("algo", ""))
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"draft config has unknown keys {unknown}; written by a newer DeepSpec?")
        d = dict(d)
        d["feature_layers"] = tuple(d.get("feature_layers", ()))
        d["confidence_temperature"] = tuple(d.get("confidence_temperature", ()))
        cfg = cls(**d)
        cfg.validate()
        return cfg


def _algorithm(algo: str):
    """The registered algorithm `algo`, or ValueError naming the registered ones."""
    try:
        return resolve_algorithm(algo)
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None


def config_class(algo: str) -> type[DraftConfig]:
    """The class a config.json of `algo` reads into (the algorithm's `config`); ValueError for an unknown algo."""
    return load_part(_algorithm(algo).config)
