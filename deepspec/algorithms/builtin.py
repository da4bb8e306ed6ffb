"""The three shipped draft algorithms (docs/ALGORITHMS.md), one record each, every part named by import path."""

from __future__ import annotations

from deepspec.algorithms.algorithm import DraftAlgorithm, OnnxGraphs

#: the neural drafters' chain (no tree) and EAGLE-2 tree of 4 children per node
_CHAIN_AND_TREE = ({"tree_branches": 0}, {"tree_branches": 4})

EAGLE3 = DraftAlgorithm(
    name="eagle3",
    module="deepspec.models.drafts.eagle3:Eagle3Draft",
    drafter="deepspec.decoding.drafters.eagle3:Eagle3Drafter",
    loss="training.losses:eagle3_objective",
    layouts=("deepspec", "canonical"),
    tree_options=_CHAIN_AND_TREE,
    export_writers={
        "vllm": "export.drafts.eagle3:VLLM",
        "sglang": "export.drafts.eagle3:SGLANG",
        "tensorrt-llm": "export.drafts.eagle3:TENSORRT_LLM",
    },
    onnx=OnnxGraphs(
        ("eagle3_fc.onnx", "eagle3_step.onnx", "eagle3_head.onnx"), "export.onnx.draft_graph:build_eagle3_graphs"
    ),
)

DFLASH = DraftAlgorithm(
    name="dflash",
    module="deepspec.models.drafts.dflash:DFlashDraft",
    drafter="deepspec.decoding.drafters.dflash:DFlashDrafter",
    loss="training.losses:dflash_objective",
    default_num_layers=2,
    tree_options=_CHAIN_AND_TREE,
    export_writers={"vllm": "export.drafts.block:DFLASH_VLLM", "sglang": "export.drafts.block:DFLASH_SGLANG"},
    onnx=OnnxGraphs(("dflash_context.onnx", "dflash_block.onnx"), "export.onnx.draft_graph:build_dflash_graphs"),
)

DSPARK = DraftAlgorithm(
    name="dspark",
    module="deepspec.models.drafts.dspark:DSparkDraft",
    drafter="deepspec.decoding.drafters.dspark:DSparkDrafter",
    loss="training.losses:dspark_loss",
    default_num_layers=2,
    calibrate="training.calibration:calibrate_dspark",
    tree_options=_CHAIN_AND_TREE,
    export_writers={"vllm": "export.drafts.block:DSPARK_VLLM", "sglang": "export.drafts.block:DSPARK_SGLANG"},
    onnx=OnnxGraphs(
        ("dflash_context.onnx", "dflash_block.onnx", "dspark_markov.onnx"),
        "export.onnx.draft_graph:build_dspark_graphs",
    ),
)

BUILTIN_ALGORITHMS = (EAGLE3, DFLASH, DSPARK)
