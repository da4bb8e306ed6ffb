"""`HFTextTarget`: the half of the `Target` contract that comes from a Hugging Face tokenizer and an `ArchSpec`
(text in and out, the fingerprint a draft is checked against, the default captured layers).

Every backend (the PyTorch decoder, the ONNX Runtime graph) inherits it, so a draft trained on one backend's
fingerprint loads on the other and both tokenize identically. A subclass provides `name`, `path` (the directory
holding tokenizer.json), `spec` and `tokenizer`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from deepspec.models.arch import ArchSpec
from deepspec.models.chat_templates import require_chat_template

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class HFTextTarget:
    #: what the subclass provides (module docstring): the served name, the directory of tokenizer.json, the sizes
    #: and the tokenizer
    name: str
    path: Path
    spec: ArchSpec
    tokenizer: PreTrainedTokenizerBase
    #: torch's intra-op threads while the engine steps this target; None = torch's own (target.py)
    host_threads: int | None = None
    #: a multi-token pass over several rows runs one row at a time (target.py)
    multi_token_rows_serial: bool = False
    #: forward takes row_lengths, each row computing only its own first tokens (target.py)
    ragged_rows: bool = False

    @property
    def vocab_size(self) -> int:
        return self.spec.vocab_size

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=True)["input_ids"]

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """Render messages with the target's chat template (generation prompt added) and tokenize."""
        require_chat_template(self.tokenizer, self.name, self.spec.family)
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert isinstance(text, str)  # tokenize=False renders the text
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def recorded_step_curve(self) -> dict[int, float] | None:
        """{T: seconds} of a batch-1 verify pass measured for this target on this machine before it loaded (an
        export's record), or None: the engine then times its own probe passes."""
        return None

    def decode(self, token_ids: list[int]) -> str:
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        assert isinstance(text, str)  # one sequence of ids decodes to one string
        return text

    def default_feature_layers(self, count: int = 5) -> tuple[int, ...]:
        """`count` layers from layer 1 at an even stride, never the last (a 36-layer Qwen3 → 1, 9, 17, 25, 33):
        low, middle and high features, as Eagle3 and DFlash read them."""
        last_allowed = self.spec.num_layers - 2
        stride = max(1, (self.spec.num_layers - 2) // max(count - 1, 1))
        return tuple(min(1 + i * stride, last_allowed) for i in range(count))

    def fingerprint(self) -> dict:
        """What a draft depends on; stored in draft checkpoints and compared on load."""
        tok_file = self.path / "tokenizer.json"
        digest = hashlib.sha256(
            tok_file.read_bytes()
            if tok_file.exists()
            else json.dumps(sorted(self.tokenizer.get_vocab().items())).encode()
        ).hexdigest()[:16]
        return {
            "architecture": self.spec.family,
            "hidden_size": self.spec.hidden_size,
            "num_layers": self.spec.num_layers,
            "vocab_size": self.spec.vocab_size,
            "tokenizer_hash": digest,
        }
