"""The record of one draft algorithm (`DraftAlgorithm`): its part in every layer, and how a part is named.

A part is the object itself or its import path, "package.module:attribute", loaded on first use by `load_part` —
the way vLLM's model registry names its model classes (`_LazyRegisteredModel`,
vllm/model_executor/models/registry.py). The built-in records (builtin.py) name every part by path, so this package
imports nothing: the model layer that reads a record never imports the engine's drafters, training or export, and
`python -m training train --help` lists the algorithms without importing torch. A record made elsewhere (a test's
toy algorithm) may hold the objects themselves.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: a part of an algorithm: the object, or "package.module:attribute" naming it
Part = Any


@dataclass(frozen=True)
class OnnxGraphs:
    """A draft's forward passes as ONNX Runtime graphs (export/onnx/draft_graph.py writes them; the worker runs them
    through deepspec/decoding/drafters/onnx_graphs.py)."""

    #: graph files, in the order `build` writes them
    files: tuple[str, ...]
    #: build(attached float32 draft, out_dir, quantization) -> the paths of `files`; quantization is the dense
    #: layers' weight format, "none" (fp32), "int8" or "int4" (export/onnx/graph.py `linear`)
    build: Part


@dataclass(frozen=True)
class DraftAlgorithm:
    """Everything DeepSpec needs to train, serve and export one draft algorithm, looked up by `name`."""

    #: `algo` in a draft directory's config.json and `model.algo` in a training config
    name: str
    #: the draft network: module(cfg) -> a DraftModel (deepspec/models/drafts/layers.py); .attach(target) before use
    module: Part
    #: what the engine runs: drafter(model, **build_drafter options) -> a Drafter (deepspec/decoding/drafter.py)
    drafter: Part
    #: the training objective, the `Objective` signature of training/losses.py
    loss: Part
    #: the class config.json reads into: DraftConfig, or a subclass holding the algorithm's own keys
    config: Part = "deepspec.models.drafts.config:DraftConfig"
    #: draft decoder layers when the training config does not say
    default_num_layers: int = 1
    #: the tensor layouts its config may name (`DraftConfig.layout`)
    layouts: tuple[str, ...] = ("deepspec",)
    #: calibrate(draft, target, features_source, sequences, held_out_indices, num_anchors, seed) -> report rows, run
    #: after training on rows held out of it (it writes what it fits into draft.cfg); None = nothing to fit
    calibrate: Part | None = None
    #: the build_drafter options of its chain and of its tree, so a report puts one beside the other; None = no trees
    tree_options: tuple[dict, dict] | None = None
    #: engine ("vllm", "sglang", "tensorrt-llm") -> its DraftWriter (export/job.py), for the engines that load this
    #: algorithm; DeepSpec's own formats (pytorch, onnx) carry any draft directory as it is
    export_writers: Mapping[str, Part] = field(default_factory=dict)
    #: its forward passes as ONNX graphs; None = an ONNX export carries the draft and the worker runs it in PyTorch
    onnx: OnnxGraphs | None = None

    def __post_init__(self) -> None:
        if not self.name or self.name.strip() != self.name or ":" in self.name:
            raise ValueError(f"a draft algorithm needs a plain name (the config.json 'algo'), got {self.name!r}")


def load_part(part: Part):
    """The object a part names: "package.module:attribute" imported now, anything else as it is."""
    if not isinstance(part, str):
        return part
    module, sep, attribute = part.partition(":")
    if not sep or not module or not attribute:
        raise ValueError(f"a part named by path looks like 'package.module:attribute', got {part!r}")
    return getattr(importlib.import_module(module), attribute)
