"""`DecoderTarget`: the `Target` (deepspec/models/target.py) that `load_target` returns — a Hugging Face tokenizer
plus the lean PyTorch decoder (deepspec/models/decoder.py) over the model's own weights.

`forward` returns logits and the residual outputs of the layers a draft asks for. The fingerprint names what a
draft depends on (family, sizes, tokenizer), so a draft trained on one target refuses to load on another.

The decoder itself is private (`_model`): everything above the model layer goes through the `Target` members, and
the one caller that needs the module, an exporter rewriting its weights as another runtime's graph, asks for it by
name with `pytorch_decoder(target)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from deepspec.models.arch import ArchSpec
from deepspec.models.decoder import Decoder, DecoderOutput
from deepspec.models.hf_text import HFTextTarget
from deepspec.models.kv_cache import KVCache
from deepspec.models.target import TargetEmbeddings

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass(eq=False)  # a target is compared and hashed by identity (engines key per-target measurements on it)
class DecoderTarget(HFTextTarget):
    name: str
    #: directory holding config.json, *.safetensors and the tokenizer
    path: Path
    config: object  # transformers.PretrainedConfig
    spec: ArchSpec
    _model: Decoder
    tokenizer: PreTrainedTokenizerBase
    max_seq_len: int
    eos_token_ids: tuple[int, ...]
    #: "none" (dense weights in `dtype`) or "gguf" (4-bit GGUF matmul weights; see target_loader.QUANTIZATIONS)
    quantization: str = "none"
    _hf_model: object = field(default=None, repr=False)
    #: the decoder scores token trees in one pass (tree_parents) and its KVCache compacts them (keep_path)
    supports_tree_attention = True

    @property
    def device(self) -> torch.device:
        return self._model.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self._model.dtype

    @property
    def attention_dtype(self) -> torch.dtype:
        return self._model.attention_dtype

    # ---- model -------------------------------------------------------------------------------------------------
    def forward(
        self,
        tokens: torch.Tensor,  # [B, T]
        start: torch.Tensor,  # [B] first position of each row
        cache=None,
        *,
        feature_layers: tuple[int, ...] = (),
        logits: str | torch.Tensor = "all",
        return_final_hidden: bool = False,
        max_start: int | None = None,
        tree_parents: torch.Tensor | None = None,
    ) -> DecoderOutput:
        return self._model(
            tokens,
            start,
            cache,
            feature_layers=feature_layers,
            logits=logits,
            return_final_hidden=return_final_hidden,
            max_start=max_start,
            tree_parents=tree_parents,
        )

    def new_cache(self, num_slots: int, max_seq_len: int) -> KVCache:
        return KVCache(self.spec, num_slots, max_seq_len, self.attention_dtype, self.device)

    def lm_head(self, final_hidden: torch.Tensor) -> torch.Tensor:
        return self._model.lm_head(final_hidden)

    def embeddings(self) -> TargetEmbeddings:
        m = self._model
        return TargetEmbeddings(m.embed.detach(), float(m.embed_scale), m.head.detach())

    def hf_model(self):
        """The Hugging Face model on the same weights (reference forward for tests and generic training)."""
        if self._hf_model is None:
            from transformers import AutoModelForCausalLM

            self._hf_model = AutoModelForCausalLM.from_pretrained(self.path, dtype=self.dtype).eval()
        return self._hf_model


def pytorch_decoder(target) -> Decoder:
    """The lean PyTorch decoder behind a `DecoderTarget`: its weights, RoPE tables and sizes (`max_positions`,
    `embed_scale`, `head is embed` when tied), for an exporter that writes them as another runtime's graph
    (export/onnx) and the checks that compare that graph with it. The engine never needs it (`target.forward`).
    TypeError for any other backend (an ONNX export, a test double), which has no PyTorch weights to hand out."""
    if not isinstance(target, DecoderTarget):
        raise TypeError(
            f"{type(target).__name__} has no PyTorch decoder: load the model directory, alias or GGUF "
            "with deepspec.models.load_target (an ONNX export cannot be exported again)"
        )
    return target._model
