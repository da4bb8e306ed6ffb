"""The neural drafts as ONNX graphs (export/onnx/draft_graph.py) run by their own drafters through `OnnxDraftModel`
(deepspec/decoding/drafters/onnx_graphs.py): every proposal equals the PyTorch draft's, for chains, trees and sampled
rows, after the same committed context; an onnx export with a neural draft serves it through the graphs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from deepspec.algorithms import resolve_algorithm
from deepspec.decoding.draft_driver import DraftDriver
from deepspec.decoding.drafter import DraftSampling
from deepspec.decoding.drafters.dflash import DFlashDrafter
from deepspec.decoding.drafters.dspark import DSparkDrafter
from deepspec.decoding.drafters.eagle3 import Eagle3Drafter
from deepspec.decoding.drafters.neural import NeuralDrafter
from deepspec.decoding.drafters.onnx_graphs import OnnxDraftModel, draft_graph_dir
from deepspec.decoding.registry import build_drafter
from export.onnx.draft_graph import build_draft_graphs
from export.onnx.graph import LINEAR_KERNELS
from tests.deepspec.decoding.checked import drafter_of
from tests.export.conftest import HD16, write_draft, write_hf_target

DRAFTERS = {"eagle3": Eagle3Drafter, "dflash": DFlashDrafter, "dspark": DSparkDrafter}


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    return write_hf_target(tmp_path_factory.mktemp("t") / "llama", "llama", **HD16)


def _pair(tmp_path: Path, target_dir: Path, algo: str, tree: int = 0, **draft_options):
    """(target, PyTorch drafter, ONNX drafter) of the same random draft, both bound to the PyTorch target and each
    driven by its own DraftDriver (its own batch state, as in two engines)."""
    from deepspec.models import load_target
    from deepspec.models.drafts import load_draft

    target = load_target(str(target_dir), dtype="float32")
    path = write_draft(tmp_path / algo, target_dir, algo, **draft_options)
    model = load_draft(path, target, dtype=torch.float32)
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    written = build_draft_graphs(model, graphs)
    assert [p.name for p in written] == _graph_files(algo)
    options = {"tree_branches": tree} if tree else {}
    ref = DRAFTERS[algo](model, **options)
    ours = DRAFTERS[algo](
        OnnxDraftModel(load_draft(path, target, dtype=torch.float32), graphs, num_threads=1), **options
    )
    return target, *(DraftDriver(d, num_slots=3, max_tokens=64, target=target) for d in (ref, ours))


def _graph_files(algo: str) -> list[str]:
    """The ONNX graph files `algo` exports (every neural draft has them)."""
    graphs = resolve_algorithm(algo).onnx
    assert graphs is not None, f"{algo} exports no ONNX graphs"
    return list(graphs.files)


def _same(a, b, probs: bool = False) -> None:
    assert torch.equal(a.tokens, b.tokens)
    assert torch.equal(a.num_tokens, b.num_tokens)
    for name in ("parents", "survival") + (("probs",) if probs else ()):
        x, y = getattr(a, name, None), getattr(b, name, None)
        assert (x is None) == (y is None), name
        if x is not None:
            assert y is not None
            torch.testing.assert_close(x.float(), y.float(), atol=1e-4, rtol=1e-4)


def _drive(target, ref, ours, k: int = 4, sampled: bool = False) -> int:
    """Feed both driven drafters the same committed context in uneven chunks and compare every proposal; returns
    how many proposals were compared."""
    torch.manual_seed(3)
    slots = [0, 2]
    F = target.spec.hidden_size * len(ref.drafter.feature_layers)
    for d in (ref, ours):
        for s in slots:
            d.start(s, [5])
    compared = 0
    for m, num in ((6, [6, 4]), (3, [1, 3]), (2, [2, 2])):
        tokens = torch.randint(0, target.vocab_size, (2, m))
        features = torch.randn(2, m, F)
        for d in (ref, ours):
            d.commit(slots, [tokens[b, :n].tolist() for b, n in enumerate(num)], features)
        temps = torch.tensor([0.0, 1.0]) if sampled else torch.zeros(2)
        proposals = []
        for d in (ref, ours):
            gens: list[torch.Generator | None] = [torch.Generator().manual_seed(11), torch.Generator().manual_seed(12)]
            proposals.append(d.propose(slots, k, DraftSampling(temps, gens)))
        _same(*proposals, probs=sampled)
        compared += 1
    return compared


@pytest.mark.parametrize("algo", ["eagle3", "dflash", "dspark"])
def test_onnx_draft_proposes_what_the_pytorch_draft_proposes(tmp_path, target_dir, algo):
    target, ref, ours = _pair(tmp_path, target_dir, algo)
    assert _drive(target, ref, ours) == 3


@pytest.mark.parametrize("algo", ["eagle3", "dspark"])
def test_onnx_draft_trees_and_sampled_rows_match(tmp_path, target_dir, algo):
    target, ref, ours = _pair(tmp_path, target_dir, algo, tree=2)
    _drive(target, ref, ours, k=5)
    target, ref, ours = _pair(tmp_path / "sampled", target_dir, algo)
    _drive(target, ref, ours, sampled=True)


def test_canonical_eagle3_layout_matches_too(tmp_path, target_dir):
    target, ref, ours = _pair(tmp_path, target_dir, "eagle3", layout="canonical")
    _drive(target, ref, ours)


def test_move_slot_keeps_the_onnx_drafters_cache(tmp_path, target_dir):
    """The cache is the drafter's own tensor: compaction (the engine's move: batch state + move_slot) moves what the
    graphs wrote."""
    target, ref, ours = _pair(tmp_path, target_dir, "dflash")
    _drive(target, ref, ours)
    for d in (ref, ours):
        d.move(2, 1)
    greedy = DraftSampling(torch.zeros(1), [None])
    _same(ref.propose([1], 4, greedy), ours.propose([1], 4, greedy))


def test_missing_graph_files_name_the_fix(tmp_path, target_dir):
    from deepspec.models import load_target
    from deepspec.models.drafts import load_draft

    target = load_target(str(target_dir), dtype="float32")
    path = write_draft(tmp_path / "d", target_dir, "dspark")
    with pytest.raises(FileNotFoundError, match="dflash_context.onnx.*python -m export --format onnx"):
        OnnxDraftModel(load_draft(path, target), tmp_path)


def test_head_without_a_block_run_is_refused(tmp_path, target_dir):
    _, _, ours = _pair(tmp_path, target_dir, "dflash")
    with pytest.raises(RuntimeError, match="call blocks"):
        drafter_of(ours.drafter, NeuralDrafter).model.head(torch.zeros(1, 4, 64))


@pytest.mark.parametrize("algo", ["dspark", "eagle3"])
def test_onnx_export_serves_its_neural_draft_through_the_graphs(tmp_path, target_dir, algo):
    """export_onnx writes draft_onnx/; load_target opens the export and the drafter registry picks the graphs for
    the export's own draft, and the engine on the ONNX target + ONNX draft decodes the PyTorch engine's tokens with
    the same acceptance."""
    from deepspec.decoding import SamplingParams, SpecEngine
    from deepspec.models import load_target
    from deepspec.models.onnx_target import OnnxTarget
    from export.onnx.exporter import export_onnx

    draft = write_draft(tmp_path / "draft", target_dir, algo)
    out = tmp_path / "onnx"
    out.mkdir()
    meta = export_onnx(load_target(str(target_dir), dtype="float32"), str(draft), out)
    assert meta["draft"]["graphs"] == _graph_files(algo)
    onnx_target = load_target(str(out))
    assert isinstance(onnx_target, OnnxTarget)
    assert draft_graph_dir(out / "draft", onnx_target) == out / "draft_onnx"
    assert draft_graph_dir(draft, onnx_target) is None  # another draft directory: its PyTorch drafter
    drafter = drafter_of(build_drafter(str(out / "draft"), onnx_target), NeuralDrafter)
    assert isinstance(drafter.model, OnnxDraftModel)
    assert not isinstance(drafter_of(build_drafter(str(draft), onnx_target), NeuralDrafter).model, OnnxDraftModel)
    assert build_drafter("none", onnx_target) is None

    reference = load_target(str(target_dir), dtype="float32")
    prompts = [[1, 40, 41, 42, 43], [1, 50, 51]]

    def run(target, d):
        engine = SpecEngine(target, d, max_batch_size=2, max_seq_len=64, num_speculative_tokens=3)
        return [o.token_ids for o in engine.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))]

    assert run(onnx_target, drafter) == run(reference, build_drafter(str(draft), reference))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m-eagle3", "smollm2-135m-dflash", "smollm2-135m-dspark"])
def test_shipped_drafts_propose_the_same_through_their_graphs(tmp_path, smollm2, name):
    """The shipped neural drafts, on the real target's features of a real prompt: ONNX proposals = PyTorch's."""
    from deepspec.models.drafts import load_draft
    from tests.export.conftest import REPO

    path = REPO / "drafts" / name
    model = load_draft(path, smollm2, dtype=torch.float32)
    build_draft_graphs(model, tmp_path)
    ref = DRAFTERS[model.cfg.algo](model)
    ours = DRAFTERS[model.cfg.algo](
        OnnxDraftModel(load_draft(path, smollm2, dtype=torch.float32), tmp_path, num_threads=2)
    )
    ids = smollm2.tokenizer.encode('def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n')
    tokens = torch.tensor([ids])
    out = smollm2.forward(tokens, torch.zeros(1, dtype=torch.long), None, feature_layers=ref.feature_layers)
    greedy = DraftSampling(torch.zeros(1), [None])
    drivers = [DraftDriver(d, num_slots=1, max_tokens=128, target=smollm2) for d in (ref, ours)]
    for d in drivers:
        d.start(0, [ids[0]])
    n = len(ids)
    for done, cut in ((0, n - 4), (n - 4, n - 1), (n - 1, n)):  # commit in three chunks, proposing after each
        for d in drivers:
            d.commit([0], [ids[done:cut]], out.features[:, done:cut])
        ref_proposal, our_proposal = (d.propose([0], 5, greedy) for d in drivers)
        _same(ref_proposal, our_proposal)


@pytest.mark.parametrize("algo", ["eagle3", "dflash", "dspark"])
def test_int8_draft_graphs_quantize_every_dense_layer_and_stay_close_to_fp32(tmp_path, target_dir, algo):
    """build_draft_graphs(..., "int8"): every dense layer and the head become the int8 kernel (no fp32 weight
    left but the small DSpark Markov head's), and the first graph's outputs stay within int8 rounding of fp32's."""
    import onnx

    from deepspec.models import load_target
    from deepspec.models.drafts import load_draft

    target = load_target(str(target_dir), dtype="float32")
    path = write_draft(tmp_path / algo, target_dir, algo)
    dirs = {q: tmp_path / q for q in ("none", "int8")}
    for q, d in dirs.items():
        d.mkdir()
        build_draft_graphs(load_draft(path, target, dtype=torch.float32), d, q)
    for name in _graph_files(algo):
        graph = onnx.load(dirs["int8"] / name, load_external_data=False).graph
        if name == "dspark_markov.onnx":
            continue
        assert LINEAR_KERNELS["int8"] in {n.op_type for n in graph.node}, name
        assert not [t.name for t in graph.initializer if t.name.endswith(".weight_t")], name
    models = {
        q: OnnxDraftModel(load_draft(path, target, dtype=torch.float32), d, num_threads=1) for q, d in dirs.items()
    }
    torch.manual_seed(0)
    F = target.spec.hidden_size * len(models["none"].cfg.feature_layers)
    features = torch.randn(2, 5, F)
    if algo == "eagle3":
        outs = {q: [m.fc(features)] for q, m in models.items()}
    else:
        positions = torch.arange(5).expand(2, 5)
        outs = {q: [t for kv in m.context_kv(features, positions) for t in kv] for q, m in models.items()}
    for fp32, int8 in zip(outs["none"], outs["int8"]):
        assert not torch.equal(fp32, int8)  # quantized, not the same graph
        assert (int8 - fp32).norm() <= 0.05 * fp32.norm()


def test_a_quantized_export_serves_int8_draft_graphs_losslessly(tmp_path, target_dir):
    """An int4 export's DSpark graphs are int8 (DRAFT_QUANTIZATION), recorded in onnx.json; the engine on that export
    with them decodes exactly what the int4 target decodes alone."""
    from deepspec.decoding import SamplingParams, SpecEngine
    from deepspec.models import load_target
    from export.onnx.exporter import DRAFT_QUANTIZATION, export_onnx

    assert DRAFT_QUANTIZATION == {"none": "none", "int8": "int8", "int4": "int8"}
    draft = write_draft(tmp_path / "draft", target_dir, "dspark")
    out = tmp_path / "onnx"
    out.mkdir()
    meta = export_onnx(load_target(str(target_dir), dtype="float32"), str(draft), out, quant="int4")
    assert meta["draft"]["quantization"] == "int8"
    target = load_target(str(out))
    drafter = drafter_of(build_drafter(str(out / "draft"), target), NeuralDrafter)
    assert isinstance(drafter.model, OnnxDraftModel)
    prompts = [[1, 40, 41, 42, 43], [1, 50, 51]]

    def run(d):
        engine = SpecEngine(target, d, max_batch_size=2, max_seq_len=64, num_speculative_tokens=3)
        return [o.token_ids for o in engine.generate(prompts, SamplingParams(max_tokens=12, ignore_eos=True))]

    assert run(drafter) == run(None)
