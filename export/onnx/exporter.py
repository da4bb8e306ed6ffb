"""`--format onnx`: the target as an ONNX Runtime graph beside everything the worker needs to serve it.

Output directory (what `load_onnx_target` and `python -m service worker --bundle-dir DIR` read):

    target.onnx, target.onnx.data   the decoder (export/onnx/graph.py), fp32 or 4-bit weights
    target_verify.onnx              the same graph ending in the plugins' greedy_accept node (same weights file)
    onnx.json                       graph file, quantization, captured layers (hs ids = layer + 1), eos ids, limits
    lm_head.npy                     an untied head in fp32 [V, H], when the graph holds it quantized (the drafts
                                    that share the target's head read it; the graph's own copy is 4- or 8-bit)
    config.json, tokenizer*, generation_config.json   the target's own, so the fingerprint matches its drafts
    draft/                          the draft directory, copied (neural drafts, corpus lookup), when there is one
    draft_onnx/                     a neural draft's graphs (export/onnx/draft_graph.py: Eagle3, DFlash, DSpark),
                                    int8 beside a quantized target (DRAFT_QUANTIZATION); the worker runs the draft
                                    through them (deepspec/decoding/drafters/onnx_graphs.py)

The worker runs target.onnx and verifies on its logits with the plugins ops (greedy and sampled rows alike);
target_verify.onnx is the verification-terminated graph for runtimes that verify inside the graph.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

#: files of the target directory copied next to the graph (tokenizer and config; never the weights)
_TARGET_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "added_tokens.json",
)
#: weight formats of the graph; "auto" exports each of AUTO_CANDIDATES and keeps the fastest here
#: (export/onnx/auto_quantization.py's export_fastest_format)
QUANTIZATIONS = ("none", "int4", "int8", "auto")
#: the target graph ending in the plugins' greedy_accept node (same weights file)
VERIFY_GRAPH = "target_verify.onnx"
#: where a neural draft's graphs go (export/onnx/draft_graph.py)
DRAFT_GRAPH_DIR = "draft_onnx"
#: an untied head's fp32 copy beside a quantized graph (OnnxTarget.embeddings reads it)
HEAD_FILE = "lm_head.npy"
#: the target graph's weight format -> its neural draft graphs' (export/onnx/draft_graph.py). A draft's forward is
#: a few tokens wide, where int8 per-channel weights (graph.int8_linear) read a quarter of fp32's bytes and
#: stay flat: DSpark's round on this project's 2-core Xeon fell from 7.7 to 3.3 ms (int4's MatMulNBits: 4.5 ms).
#: A draft's precision never changes the output (the target verifies every token); an fp32 export keeps fp32
#: drafts, the reference the graphs are tested against.
DRAFT_QUANTIZATION = {"none": "none", "int8": "int8", "int4": "int8"}


def resolve_draft_dir(draft, target) -> Path | None:
    """A draft spec (None, a drafter keyword such as 'none', 'prompt-lookup' or 'auto', or a directory) → its
    directory, or None."""
    from deepspec.decoding.registry import AUTO_MIN_ACCEPTANCE_LENGTH, drafter_keywords

    if draft == "auto":
        from deepspec.models.drafts import best_shipped_draft

        return best_shipped_draft(target, min_acceptance_length=AUTO_MIN_ACCEPTANCE_LENGTH)
    if draft in (None, "") or draft in drafter_keywords():
        return None
    path = Path(draft)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"draft {path}: no config.json (expected a draft directory from python -m training)")
    return path


def _write_draft_graphs(target, draft_dir: Path, algo: str, quant: str, out: Path) -> dict:
    """A neural draft's forward passes as graphs in out/DRAFT_GRAPH_DIR, in the weight format DRAFT_QUANTIZATION
    gives the target's; → what onnx.json's `draft` records of them ({} for a draft without graphs: lookup)."""
    import torch

    from deepspec.algorithms import available_algorithms, resolve_algorithm

    if algo not in available_algorithms() or resolve_algorithm(algo).onnx is None:
        return {}
    from deepspec.models.drafts import load_draft
    from export.onnx.draft_graph import build_draft_graphs

    (out / DRAFT_GRAPH_DIR).mkdir()
    graphs = build_draft_graphs(
        load_draft(draft_dir, target, dtype=torch.float32), out / DRAFT_GRAPH_DIR, DRAFT_QUANTIZATION[quant]
    )
    return {
        "graphs_dir": DRAFT_GRAPH_DIR,
        "quantization": DRAFT_QUANTIZATION[quant],
        "graphs": [p.name for p in graphs],
    }


def exported_draft_dir(export_dir: str | Path, meta: dict) -> Path | None:
    """The draft directory an export holds (its copy, onnx.json `draft.path`), or None: no draft, or a drafter named
    by keyword (prompt lookup) that has no directory."""
    path = (meta.get("draft") or {}).get("path")
    return Path(export_dir) / path if path and (Path(export_dir) / path / "config.json").is_file() else None


def draft_feature_layers(draft_dir: Path | None) -> tuple[int, ...]:
    """The target layers whose residual outputs the draft reads (none for lookup drafts)."""
    if draft_dir is None:
        return ()
    header = json.loads((draft_dir / "config.json").read_text())
    return tuple(int(i) for i in header.get("feature_layers", ()))


def export_onnx(
    target,
    draft,
    out_dir: str | Path,
    dtype: str = "float32",
    quant: str = "none",
    advance=lambda n=1: None,
    chat_template: str | None = None,
) -> dict:
    """Write the ONNX export of `target` (a loaded fp32 target or a target spec) and `draft` into out_dir (which must
    exist and be empty); returns what the manifest records about it (graph, quantization, draft, layers).
    `advance()` ticks once per decoder layer written; `chat_template` (template text) goes into the copied
    tokenizer files, so the worker serving the export renders chat with it."""
    from deepspec.models import pytorch_decoder
    from export.onnx.graph import build_target_graph, build_verify_graph, check_supported

    _check_formats(dtype, quant)
    target = _float32_target(target)
    decoder = pytorch_decoder(target)
    check_supported(target.spec)
    out = Path(out_dir)
    draft_dir = resolve_draft_dir(draft, target)
    draft_algo = _checked_draft_algo(draft_dir, target) if draft_dir is not None else None
    layers = draft_feature_layers(draft_dir)
    graph_name = "target.onnx"
    build_target_graph(decoder, layers, out, quant, graph_name, advance)
    build_verify_graph(out, graph_name, VERIFY_GRAPH)
    _copy_target_files(target, out, chat_template)
    meta = _target_meta(target, decoder, graph_name, quant, layers)
    if quant != "none" and not meta["tied"]:  # the graph's head is quantized: the drafts' fp32 copy beside it
        _save_head(decoder, out / HEAD_FILE)
        meta["head_file"] = HEAD_FILE
    meta["draft"] = _draft_meta(target, draft, draft_dir, draft_algo, quant, out)
    (out / "onnx.json").write_text(json.dumps(meta, indent=2) + "\n")  # what load_target opens to time it
    meta["step_curve"] = record_step_curve(out)
    (out / "onnx.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def _check_formats(dtype: str, quant: str) -> None:
    """The activation dtype and weight format export_onnx writes, refused with the way out before any work."""
    if dtype not in ("float32", "fp32"):
        raise ValueError(
            f"the ONNX graph runs float32 activations; --dtype {dtype} is not exported "
            "(use --quant int4 for 4-bit weights)"
        )
    if quant not in QUANTIZATIONS:
        raise ValueError(f"unknown ONNX quantization {quant!r}; choose one of {', '.join(QUANTIZATIONS)}")
    if quant == "auto":  # a choice among several exports, made above this one (auto_quantization.py)
        raise ValueError("export_onnx writes one weight format; export_fastest_format chooses one for 'auto'")


def _float32_target(target):
    """A target spec loaded in float32, or a loaded target checked to be float32 (the graph's weights are traced
    from it)."""
    if isinstance(target, str):
        from deepspec.models import load_target

        target = load_target(target, dtype="float32")
    if target.dtype.is_floating_point and str(target.dtype) != "torch.float32":
        raise ValueError("export the ONNX graph from the float32 target (load_target(..., dtype='float32'))")
    return target


def _checked_draft_algo(draft_dir: Path, target) -> str:
    """The draft's algorithm, once its header says it was trained for `target` (checked before the graph is
    written, so a mismatched draft fails in a second, not after the export)."""
    from deepspec.models.drafts import check_target, read_checkpoint_header

    header = read_checkpoint_header(draft_dir)
    check_target(header.get("target", {}), target, where=f"draft {draft_dir}")
    return header["algo"]


def _copy_target_files(target, out: Path, chat_template: str | None) -> None:
    """The target's tokenizer and config files beside the graph (its fingerprint matches its drafts'), with
    `chat_template` saved into them when given."""
    from deepspec.models.chat_templates import save_chat_template

    for name in _TARGET_FILES:
        if (Path(target.path) / name).is_file():
            shutil.copy2(Path(target.path) / name, out / name)
    if chat_template is not None:
        save_chat_template(out, chat_template)


def _target_meta(target, decoder, graph_name: str, quant: str, layers: tuple[int, ...]) -> dict:
    """What onnx.json records of the target graph."""
    return {
        "graph": graph_name,
        "verify_graph": VERIFY_GRAPH,
        "target_name": target.name,
        "quantization": quant,
        "feature_layers": list(layers),
        #: the same layers as Hugging Face output_hidden_states indices (hs[i + 1] is the output of layer i)
        "feature_hs_ids": [i + 1 for i in layers],
        "max_positions": int(decoder.max_positions),
        "eos_token_ids": list(target.eos_token_ids),
        "tied": decoder.head is decoder.embed,
        "embed_scale": float(decoder.embed_scale),
        "fingerprint": target.fingerprint(),
    }


def _save_head(decoder, path: Path) -> None:
    import numpy as np
    import torch

    np.save(path, decoder.head.detach().to(torch.float32).numpy())


def _draft_meta(target, draft, draft_dir: Path | None, algo: str | None, quant: str, out: Path) -> dict:
    """onnx.json's `draft`: the copied draft directory and its graphs, or the drafter the worker builds by name."""
    from deepspec.decoding.registry import drafter_keywords

    if draft_dir is None:
        named = draft in drafter_keywords() and draft != "auto"  # a drafter the worker builds by name
        return {"path": draft if named else "none", "algo": None}
    assert algo is not None  # read from draft_dir's header by _checked_draft_algo
    shutil.copytree(draft_dir, out / "draft", ignore=shutil.ignore_patterns("reports", "__pycache__"))
    return {"path": "draft", "algo": algo, **_write_draft_graphs(target, draft_dir, algo, quant, out)}


def record_step_curve(out: Path) -> dict:
    """The written graph's verify-step curve on this machine, as onnx.json stores it (deepspec/models/
    step_curve.py: a few seconds), where the engine's verification budget reads it instead of probing again."""
    from deepspec.models import load_target
    from deepspec.models.step_curve import curve_record, measure_recorded_curve

    return curve_record(measure_recorded_curve(load_target(str(out))))
