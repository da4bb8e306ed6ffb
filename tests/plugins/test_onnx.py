"""The ops as ONNX custom nodes: exported by torch.onnx, run by ONNX Runtime, equal to the torch ops."""

import importlib

import numpy as np
import pytest
import torch

import plugins
from plugins import onnx_ops
from plugins.schema import ONNX_DOMAIN, OPS, PLUGIN_ATTRIBUTES, TRT_ATTRIBUTES, TRT_NAMESPACE
from tests.plugins.trt_standin import tensorrt_plugin

ort = pytest.importorskip("onnxruntime")


class Verify(torch.nn.Module):
    """Every op in one graph, as a target's verify graph would call them."""

    def forward(
        self,
        drafts,
        num,
        logits,
        q,
        T,
        tk,
        tp,
        seeds,
        tokens,
        parents,
        num_nodes,
        tree_logits,
        cache,
        start,
        confidence,
    ):
        a, b = plugins.greedy_accept(drafts, num, logits)
        c, d = plugins.rejection_sample(drafts, num, logits, q, T, tk, tp, seeds)
        e, f = plugins.rejection_sample(drafts, num, logits, None, T, tk, tp, seeds)
        probs = plugins.process_logits(logits, T, tk, tp)
        g, h, path = plugins.tree_accept(tokens, parents, num_nodes, tree_logits, None, T, tk, tp, seeds)
        cache = plugins.compact_kv(cache, start, path, g)
        kept, survival = plugins.confidence_truncate(confidence, num, 0.4)
        return a, b, c, d, e, f, probs, g, h, path, cache, kept, survival


def _inputs():
    g = torch.Generator().manual_seed(0)
    B, k, V, N = 4, 3, 12, 5
    logits = torch.randn(B, k + 1, V, generator=g) * 2
    drafts = logits[:, :k].argmax(-1)
    drafts[1, 1] = (drafts[1, 1] + 1) % V
    q = torch.softmax(torch.randn(B, k, V, generator=g), -1)
    T = torch.tensor([0.0, 1.0, 0.7, 1.2])
    tk, tp = torch.tensor([0, 0, 5, 3]), torch.tensor([1.0, 0.9, 1.0, 0.8])
    seeds = torch.tensor([1, 2, 3, 4])
    parents = torch.tensor([[-1, 0, 0, 1, 2]] * B)
    tree_logits = torch.randn(B, N, V, generator=g)
    tokens = torch.randint(V, (B, N), generator=g)
    tokens[:, 1] = tree_logits[:, 0].argmax(-1)
    cache = torch.randn(2, B, 2, 16, 4, generator=g)
    return (
        drafts,
        torch.tensor([3, 3, 1, 0]),
        logits,
        q,
        T,
        tk,
        tp,
        seeds,
        tokens,
        parents,
        torch.tensor([5, 3, 1, 5]),
        tree_logits,
        cache,
        torch.tensor([2, 0, 5, 11]),
        torch.rand(B, k, generator=g),
    )


@pytest.fixture(scope="module")
def exported():
    program = torch.onnx.export(Verify().eval(), _inputs(), dynamo=True, verbose=False)
    assert program is not None  # the dynamo exporter returns its ONNXProgram
    return program.model_proto


def test_every_op_is_one_custom_node_with_the_tensorrt_binding_attributes(exported):
    custom = [n for n in exported.graph.node if n.domain == ONNX_DOMAIN]
    assert sorted({n.op_type for n in custom}) == sorted(OPS)
    for node in custom:
        attrs = {a.name: a for a in node.attribute}
        assert attrs["plugin_namespace"].s.decode() == TRT_ATTRIBUTES["plugin_namespace"]
        assert attrs["plugin_version"].s.decode() == TRT_ATTRIBUTES["plugin_version"]
        assert attrs["aot"].i == 1
        assert len(node.output) == len(OPS[node.op_type])
        if node.op_type in ("rejection_sample", "tree_accept"):  # picks the plugin's kernel variant
            assert attrs["has_draft_probs"].i in (0, 1)
        if node.op_type == "confidence_truncate":
            assert attrs["threshold"].f == pytest.approx(0.4)
    has_q = sorted(
        a.i for n in custom if n.op_type == "rejection_sample" for a in n.attribute if a.name == "has_draft_probs"
    )
    assert has_q == [0, 1]


def _tensorrt_registrations() -> dict[str, tuple[list[str], list[str]]]:
    """plugin id → (its tensor inputs, its attributes), as TensorRT's own frontend parsed plugins/tensorrt.py's
    `@trtp.register` functions (tests/plugins/trt_standin.py), for the plugins that also have an `aot_impl`."""
    with tensorrt_plugin():
        QDP_REGISTRY = importlib.import_module("tensorrt.plugin._lib").QDP_REGISTRY  # the stand-in's, at run time

        import plugins.tensorrt  # noqa: F401 - registers every plugin

        return {
            pid: (list(d.input_tensor_names), list(d.input_attrs))
            for pid, d in QDP_REGISTRY.items()
            if d.aot_impl_func is not None
        }


def test_every_exported_node_binds_to_a_tensorrt_plugin_with_its_inputs_and_attributes(exported):
    plugins_by_name = _tensorrt_registrations()
    assert sorted(plugins_by_name) == sorted(f"{TRT_NAMESPACE}::{op}" for op in OPS)
    for node in (n for n in exported.graph.node if n.domain == ONNX_DOMAIN):
        attrs = {a.name: a for a in node.attribute}
        tensors, attributes = plugins_by_name[f"{attrs['plugin_namespace'].s.decode()}::{node.op_type}"]
        assert len(node.input) == len(tensors), node.op_type
        assert attributes == list(PLUGIN_ATTRIBUTES[node.op_type]), node.op_type
        assert set(attrs) == set(TRT_ATTRIBUTES) | set(PLUGIN_ATTRIBUTES[node.op_type]), node.op_type


def test_tensorrt_plugins_say_what_is_missing_without_tensorrt():
    try:
        importlib.import_module("tensorrt")
    except ImportError:
        with pytest.raises(ImportError, match=r"plugins.tensorrt needs TensorRT >= 10.9"):
            import plugins.tensorrt
    else:
        import plugins.tensorrt  # noqa: F401 - registers the plugins where TensorRT exists


def test_onnx_runtime_runs_the_graph_and_equals_the_torch_ops(exported):
    session = ort.InferenceSession(
        exported.SerializeToString(), onnx_ops.session_options(), providers=["CPUExecutionProvider"]
    )
    args = _inputs()
    feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)}
    got = session.run(None, feeds)
    want = Verify()(*[a.clone() for a in args])
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-6, atol=1e-7)
