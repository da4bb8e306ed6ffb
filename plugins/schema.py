"""The op set's contract: names, and the identifiers each runtime binds them by. No behaviour lives here.

Every op is `torch.ops.deepspec.<name>` in PyTorch, an ONNX node `<ONNX_DOMAIN>::<name>` carrying
`TRT_ATTRIBUTES`, and the TensorRT plugin `<TRT_NAMESPACE>::<name>` version `TRT_VERSION`. Shapes and dtypes of
each op are documented on its reference implementation (plugins/reference/) and in plugins/README.md.
"""

#: torch.library namespace: torch.ops.deepspec.<op>
TORCH_NAMESPACE = "deepspec"

#: ONNX domain of the custom nodes. onnxruntime-extensions serves Python kernels only in its own domain, so the
#: nodes live there; TensorRT finds its plugin through the node attributes below, not through the domain.
ONNX_DOMAIN = "ai.onnx.contrib"
ONNX_DOMAIN_VERSION = 1

#: TensorRT plugin namespace and version: plugin id "deepspec::<op>"
TRT_NAMESPACE = "deepspec"
TRT_VERSION = "1"

#: attributes on every custom node that TensorRT's ONNX parser reads to bind it to a plugin
#: (op_type = plugin name; `aot` selects the ahead-of-time implementation, i.e. our Triton PTX)
TRT_ATTRIBUTES = {"plugin_namespace": TRT_NAMESPACE, "plugin_version": TRT_VERSION, "aot": 1}

#: op name → the node attributes its TensorRT plugin declares (besides TRT_ATTRIBUTES, which the parser consumes):
#: the ONNX export writes exactly these, and plugins/tensorrt.py's `register` functions take exactly these
PLUGIN_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "greedy_accept": (),
    "rejection_sample": ("has_draft_probs",),
    "process_logits": (),
    "tree_accept": ("has_draft_probs",),
    "compact_kv": (),
    "confidence_truncate": ("threshold",),
}

#: op name → its outputs, in order
OPS: dict[str, tuple[str, ...]] = {
    "greedy_accept": ("num_accepted", "next_token"),
    "rejection_sample": ("num_accepted", "next_token"),
    "process_logits": ("probs",),
    "tree_accept": ("num_accepted", "next_token", "path"),
    "compact_kv": ("cache",),
    "confidence_truncate": ("num_kept", "survival"),
}
