"""DecoderTarget satisfies the Target protocol, and the members the engine relies on behave as the contract says."""

import torch

from deepspec.models import DecoderTarget, SlotCache, Target, TargetEmbeddings
from deepspec.models.kv_cache import KVCache
from tests.conftest import make_tiny_target


def test_decoder_target_is_a_target(tiny_target):
    target, _ = tiny_target
    assert isinstance(target, DecoderTarget) and isinstance(target, Target)


def test_an_object_missing_a_member_is_not_a_target():
    class NoCache:  # everything but new_cache
        name, spec, max_seq_len, eos_token_ids, quantization, tokenizer = "x", None, 8, (), "none", None
        vocab_size, device, dtype, attention_dtype = 4, torch.device("cpu"), torch.float32, torch.float32

        def fingerprint(self): ...
        def encode(self, text): ...
        def encode_chat(self, messages): ...
        def decode(self, ids): ...
        def forward(self, *a, **k): ...
        def lm_head(self, h): ...
        def embeddings(self): ...
        def default_feature_layers(self, count=5): ...

    assert not isinstance(NoCache(), Target)


def test_new_cache_is_a_slot_cache_in_the_attention_dtype(tiny_target):
    target, _ = tiny_target
    cache = target.new_cache(3, 32)
    assert isinstance(cache, SlotCache) and isinstance(cache, KVCache)  # the PyTorch target's: per-layer k and v
    assert cache.k.dtype == target.attention_dtype and cache.k.shape[1] == 3 and cache.k.shape[3] == 32


def test_forward_shapes_and_lm_head_match_the_contract(tiny_target):
    target, _ = tiny_target
    tokens = torch.tensor([[1, 2, 3], [4, 5, 6]])
    out = target.forward(
        tokens,
        torch.zeros(2, dtype=torch.long),
        target.new_cache(2, 16).rows(0, 2),
        feature_layers=(0, 1),
        logits="all",
        return_final_hidden=True,
        max_start=0,
    )
    H = target.spec.hidden_size
    assert out.logits.shape == (2, 3, target.vocab_size) and out.logits.dtype == torch.float32
    assert out.features.shape == (2, 3, 2 * H) and out.final_hidden.shape == (2, 3, H)
    torch.testing.assert_close(target.lm_head(out.final_hidden), out.logits)


def test_embeddings_are_the_decoders_frozen_tensors():
    target, hf = make_tiny_target(seed=3)
    emb = target.embeddings()
    assert isinstance(emb, TargetEmbeddings) and emb.embed_scale == 1.0
    torch.testing.assert_close(emb.embed, hf.model.embed_tokens.weight)
    torch.testing.assert_close(emb.head, hf.lm_head.weight)
    assert not emb.embed.requires_grad


#: members the engine reads only from a target it has checked the class of (isinstance), not through the protocol
#: members of one target class, read after an isinstance check: OnnxTarget's (deepspec/decoding/drafters/onnx_graphs.py)
#: and NativeTarget's thread count (deepspec/decoding/drafters/eagle3.py: the native draft runs on the target's pool)
CLASS_CHECKED = {"exported_draft_graphs", "num_threads"}


def _members_read(source: str, where: str) -> dict[str, str]:
    """{member: where:line} for every read of a target's member in `source`: `<...target>.member` (self.target.x,
    target.x, ...) and getattr/hasattr(<...target>, "member"), the way a member the protocol lacks gets read."""
    import ast

    def base(node) -> str:
        return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")

    reads = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and base(node.value) in ("target", "_target", "tgt"):
            reads.setdefault(node.attr, f"{where}:{node.lineno}")
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", "") in ("getattr", "hasattr")
            and len(node.args) >= 2
            and base(node.args[0]) in ("target", "_target", "tgt")
            and isinstance(node.args[1], ast.Constant)
        ):
            reads.setdefault(node.args[1].value, f"{where}:{node.lineno}")
    return reads


def _members_read_by_the_decoding_layer() -> dict[str, str]:
    from pathlib import Path

    import deepspec.decoding

    reads = {}
    for path in sorted(Path(deepspec.decoding.__file__).parent.rglob("*.py")):
        reads = {**_members_read(path.read_text(), path.name), **reads}
    return reads


def test_the_protocol_declares_every_member_the_engine_reads():
    """A target of one's own implements the protocol; the engine must read nothing the protocol does not promise."""
    declared = set(Target.__annotations__) | {name for name in vars(Target) if not name.startswith("_")}
    undeclared = {
        m: where
        for m, where in _members_read_by_the_decoding_layer().items()
        if m not in declared and m not in CLASS_CHECKED
    }
    assert not undeclared, undeclared
    assert len(_members_read_by_the_decoding_layer()) > 10  # the scan sees the engine's reads


def test_the_scan_sees_attribute_and_getattr_reads():  # negative control: the engine read these before they were
    # declared (engine.py, planner.py before 3d99990)
    source = (
        "rows = getattr(self.target, 'multi_token_rows_serial', False)\nn = target.host_threads\n"
        "if hasattr(target, 'recorded_step_curve'): pass\nx = drafter.model\n"
    )
    assert set(_members_read(source, "x.py")) == {"multi_token_rows_serial", "host_threads", "recorded_step_curve"}
