"""`OnnxTarget`: the `Target` contract (deepspec/models/target.py) served by ONNX Runtime from an exported graph.

`python -m export --format onnx` writes the target's decoder as one graph (`target.onnx`, see export/onnx/graph.py
for its inputs and outputs) beside the tokenizer, the Hugging Face config and `onnx.json`. This class runs that graph
under the unchanged `SpecEngine`: same scheduler, drafters and metrics as the PyTorch decoder.

The KV cache is ours (`OnnxSlotCache`, the engine's layout [layers, slots, kv heads, positions, head_dim]); each
layer's rows are bound to the graph's past and present inputs and outputs at the same address (IOBinding), so
attention appends to the cache in place and a step never copies the context. ONNX Runtime's attention kernel takes
several new tokens after a past only one row at a time; such batches run row by row (decode steps and first
prompt chunks stay batched). The bindings of the cache buffers are built once per buffers and row range and kept.

Batch invariance (`batch_invariant`, or DEEPSPEC_BATCH_INVARIANT=1, like vLLM's VLLM_BATCH_INVARIANT): a token's
logits then do not depend on how many tokens share its pass, so the engine's speculative greedy output is
bit-identical to the same graph's target-only output. Every linear of the graph is row-invariant already for passes
of two rows or more (fp32 MatMul on packed weights, MatMulNBits, the int8 graph's per-row activation scales:
export/onnx/graph.py `int8_linear`; MatMulNBits takes a one-row kernel on AVX2 CPUs without AVX-512 that rounds
differently); ONNX Runtime's attention is not: its probabilities·V product takes MLAS's one-row SGEMM kernel when
a pass has one token and the general kernel otherwise, a difference of ~1e-8 that a quantized layer's rounding can
turn into a different token. So in this mode a one-token pass runs as two: the token and a copy of it one position
later, whose cache entry the next step overwrites (causal: the copy's row never reaches the real one). It costs
a one-token step ~5% (int8) to ~14% (int4), and batched decode steps run row by row (export/DESIGN.md, "ONNX
Runtime"); off by default.

`load_target` opens such a directory as this class. A neural draft exported with the target runs through its own
graphs (`exported_draft_graphs` says where they are; the drafter registry's loaders use them,
deepspec/decoding/drafters/onnx_graphs.py), on the features this graph outputs.

Limits: CPU only, float32 activations (the int4 graph keeps 4-bit weights and float32 activations).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from deepspec.models.arch import ArchSpec, arch_spec_from_config
from deepspec.models.decoder import DecoderOutput, logits_positions
from deepspec.models.hf_text import HFTextTarget
from deepspec.models.target import TargetEmbeddings

if TYPE_CHECKING:
    from onnxruntime import InferenceSession, IOBinding
    from transformers import PreTrainedTokenizerBase

#: graph metadata beside the graph: which file, which captured layers, how the weights are stored
META_FILE = "onnx.json"
#: session_options' spinning modes; DEFAULT_SPINNING unless DEEPSPEC_ORT_SPINNING names another (0 = off, 1 = always)
SPINNING_MODES = ("off", "run", "always")
DEFAULT_SPINNING = "run"
#: IOBindings kept per target (one per cache and row range; row-by-row verification of a batch of 8 uses 8)
MAX_BINDINGS = 32


class OnnxSlotCache:
    """Preallocated per-slot KV cache; `rows` hands out views, `move_slot` compacts (the engine's contract)."""

    def __init__(self, spec: ArchSpec, num_slots: int, max_seq_len: int):
        shape = (spec.num_layers, num_slots, spec.num_kv_heads, max_seq_len, spec.head_dim)
        self.k = torch.zeros(shape, dtype=torch.float32)
        self.v = torch.zeros(shape, dtype=torch.float32)
        self.num_slots, self.max_seq_len = num_slots, max_seq_len

    def rows(self, first: int, count: int) -> OnnxSlotCache._Rows:
        return OnnxSlotCache._Rows(self.k[:, first : first + count], self.v[:, first : first + count])

    def move_slot(self, src: int, dst: int, length: int) -> None:
        self.k[:, dst, :, :length].copy_(self.k[:, src, :, :length])
        self.v[:, dst, :, :length].copy_(self.v[:, src, :, :length])

    @dataclass
    class _Rows:
        k: torch.Tensor  # [L, B, nkv, S, hd]: layer i's rows k[i] are contiguous
        v: torch.Tensor


@dataclass(eq=False, repr=False)  # a target is compared and hashed by identity, and its repr stays short
class OnnxTarget(HFTextTarget):
    """A target whose forward is an ONNX Runtime session over `<engine dir>/target.onnx`."""

    name: str
    path: Path
    spec: ArchSpec
    tokenizer: PreTrainedTokenizerBase
    session: InferenceSession
    meta: dict  # onnx.json
    max_seq_len: int
    eos_token_ids: tuple[int, ...]
    #: the session's intra-op threads (a recorded step curve applies at this count only)
    num_threads: int = 0
    #: run one-token passes as two (module docstring): logits independent of the pass's width
    batch_invariant: bool = False

    #: the exported graph is causal over its T new tokens: token trees are verified as chains of first children
    supports_tree_attention = False
    #: a pass of several tokens after a past runs one row at a time (module docstring): the verification budget
    #: prices B drafted rows as B passes (verify_budget.StepTimeModel.round_seconds)
    multi_token_rows_serial = True
    #: torch's threads while the engine steps this target (deepspec/decoding/host_threads.py says why one): the forward
    #: runs in ONNX Runtime's own pool, torch only does the engine's small ops around it
    host_threads = 1

    def __post_init__(self):
        self.quantization = self.meta.get("quantization", "none")
        if self.batch_invariant:  # a one-token step also writes the next position: the RoPE table must reach it
            self.max_seq_len = min(self.max_seq_len, self.meta["max_positions"] - 1)
        self.feature_layers = tuple(self.meta.get("feature_layers", ()))
        self._embeddings: TargetEmbeddings | None = None
        self._bindings: dict[tuple, IOBinding] = {}  # see _binding

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def recorded_step_curve(self) -> dict[int, float] | None:
        """{T: seconds} of a batch-1 verify pass, as the export timed it (onnx.json's step_curve), when that was on
        this machine at this thread count; None otherwise. The engine's verification budget uses it instead of
        probing: the same curve for every start, so the budget drafts alike across restarts."""
        from deepspec.models.step_curve import recorded_curve

        return recorded_curve(self.meta.get("step_curve"), self.num_threads)

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    @property
    def attention_dtype(self) -> torch.dtype:
        return torch.float32

    # ---- model ---------------------------------------------------------------------------------------------------
    def new_cache(self, num_slots: int, max_seq_len: int) -> OnnxSlotCache:
        # batch invariance writes a copy one position past a one-token step: room for it after the last position
        return OnnxSlotCache(self.spec, num_slots, max_seq_len + int(self.batch_invariant))

    def forward(
        self,
        tokens: torch.Tensor,  # [B, T] long
        start: torch.Tensor,  # [B] long
        cache=None,  # OnnxSlotCache.rows(first, B), or None (tokens are the whole context)
        *,
        feature_layers: tuple[int, ...] = (),
        logits: str | torch.Tensor = "all",
        return_final_hidden: bool = False,
        max_start: int | None = None,
        tree_parents: torch.Tensor | None = None,
    ) -> DecoderOutput:
        if tree_parents is not None:
            raise ValueError(
                "the ONNX target has no tree attention (supports_tree_attention is False): verify token trees as "
                "chains of first children"
            )
        if return_final_hidden:
            raise NotImplementedError(
                "the ONNX target returns logits and features, not the final hidden state; "
                "train drafts against the PyTorch target"
            )
        missing = [i for i in feature_layers if i not in self.feature_layers]
        if missing:
            raise ValueError(
                f"the ONNX graph outputs the residuals of layers {list(self.feature_layers)}, not "
                f"{missing}: export it with the draft that reads them (python -m export --draft ...)"
            )
        B, T = tokens.shape
        if cache is None:  # a whole context at once: a scratch cache just big enough
            cache, start = self.new_cache(B, T).rows(0, B), torch.zeros(B, dtype=torch.long)
        starts = start.tolist()
        if max(starts) + T > self.max_seq_len:
            raise ValueError(f"sequence of {max(starts) + T} tokens exceeds the context window of {self.max_seq_len}")
        index = logits_positions(logits, B, T)
        if T == 1 and self.batch_invariant:
            return self._two_token_pass(tokens, starts, cache, feature_layers, index)
        return self._output(*self._pass(tokens, starts, cache, index), feature_layers)

    def _pass(
        self, tokens: torch.Tensor, starts: list[int], cache, index: np.ndarray | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(logits, all captured features) of one pass; several tokens after a past run row by row."""
        B, T = tokens.shape
        if T > 1 and B > 1 and max(starts) > 0:  # see the module docstring
            parts = [
                self._run(tokens[b : b + 1], starts[b : b + 1], cache, b, None if index is None else index[b : b + 1])
                for b in range(B)
            ]
            # every row has logits where index is given, and features where the graph captures any
            row_logits = [logits for logits, _ in parts if logits is not None]
            row_features = [features for _, features in parts if features is not None]
            return torch.cat(row_logits) if row_logits else None, torch.cat(row_features) if row_features else None
        return self._run(tokens, starts, cache, 0, index)

    def _two_token_pass(self, tokens: torch.Tensor, starts: list[int], cache, feature_layers, index):
        """A one-token pass as two (batch invariance, module docstring); the first row's outputs. A head that takes a
        one-row kernel for a single logit row gets both rows and the copy's logits are dropped: the fp32 graph's
        tied head (a Gemm), and the int4 graph's (MatMulNBits, whose one-row kernel on an AVX2 CPU without AVX-512
        rounds differently from its several-row one; on AVX-512 the two agree)."""
        both = index is not None and (
            self.quantization == "int4" or (self.quantization == "none" and self.meta.get("tied", True))
        )
        pass_index = np.concatenate([index, index + 1], axis=1) if both and index is not None else index
        out_logits, features = self._pass(tokens.repeat(1, 2), starts, cache, pass_index)
        return self._output(
            out_logits[:, :1] if both and out_logits is not None else out_logits,
            features[:, :1] if features is not None else None,
            feature_layers,
        )

    def _output(self, out_logits, features, feature_layers) -> DecoderOutput:
        """The engine's view: the asked feature layers out of all the graph captures."""
        if features is not None and tuple(feature_layers) != self.feature_layers:
            H = self.spec.hidden_size
            features = (
                torch.cat([features[..., self.feature_layers.index(i) * H :][..., :H] for i in feature_layers], dim=-1)
                if feature_layers
                else None
            )
        return DecoderOutput(out_logits, features if feature_layers else None)

    def _run(
        self, tokens: torch.Tensor, starts: list[int], cache, first_row: int, index: np.ndarray | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """One session run over rows first_row .. first_row+B-1 of `cache`; returns (logits, features) tensors."""
        B, T = tokens.shape
        binding = self._binding(cache, first_row, B)
        binding.bind_cpu_input("input_ids", np.ascontiguousarray(tokens.numpy(), dtype=np.int64))
        binding.bind_cpu_input("seqlens_k", np.array([s + T - 1 for s in starts], dtype=np.int32))
        binding.bind_cpu_input("total_sequence_length", np.array(max(starts) + T, dtype=np.int32))
        binding.bind_cpu_input("logits_index", index if index is not None else np.zeros((B, 0), dtype=np.int64))
        # outputs into tensors of ours: reading them back through get_outputs() wraps every bound output, the 4·L
        # cache buffers included (~0.5 ms a step)
        logits = None
        if index is None:  # an empty [B, 0, V] output: no memory of ours to bind it to
            binding.bind_output("logits", "cpu")
        else:
            logits = torch.empty(B, index.shape[1], self.spec.vocab_size)
            binding.bind_output("logits", "cpu", 0, np.float32, list(logits.shape), logits.data_ptr())
        features = None
        if self.feature_layers:
            features = torch.empty(B, T, len(self.feature_layers) * self.spec.hidden_size)
            binding.bind_output("features", "cpu", 0, np.float32, list(features.shape), features.data_ptr())
        # no RunOptions: with one, ONNX Runtime's Python wrapper looks up a GPU-graph entry it lacks and raises
        # and catches an exception per run (~50 us)
        self.session.run_with_iobinding(binding)
        return logits, features

    def _binding(self, cache, first_row: int, B: int) -> IOBinding:
        """The IOBinding of rows first_row .. first_row+B-1 of `cache`: every layer's past/present K and V bound to
        the cache's own buffers (in place); _run binds logits and features to fresh tensors per run. Binding 4·L
        buffers through Python cost ~1.5 ms of a ~17 ms int4 decode step, and they are the same buffers step after
        step, so a binding is built once per (buffers, rows) and only the four small inputs are rebound per run."""
        # addresses, shapes and strides of both buffers fix every bound address; a freed scratch cache whose memory
        # comes back with the same key has the same rows
        key = (
            cache.k.data_ptr(),
            cache.v.data_ptr(),
            tuple(cache.k.shape),
            cache.k.stride(),
            cache.v.stride(),
            first_row,
            B,
        )
        binding = self._bindings.pop(key, None)
        if binding is None:
            binding = self.session.io_binding()
            for i in range(self.spec.num_layers):
                for kind, buffer in (("key", cache.k[i]), ("value", cache.v[i])):
                    rows = buffer[first_row : first_row + B]  # [B, nkv, S, hd], contiguous: slots are outer
                    assert rows.is_contiguous() and rows.dtype == torch.float32
                    shape = list(rows.shape)
                    binding.bind_input(f"past_{kind}.{i}", "cpu", 0, np.float32, shape, rows.data_ptr())
                    binding.bind_output(f"present_{kind}.{i}", "cpu", 0, np.float32, shape, rows.data_ptr())
        self._bindings[key] = binding  # most recently used last
        while len(self._bindings) > MAX_BINDINGS:
            self._bindings.pop(next(iter(self._bindings)))
        return binding

    def exported_draft_graphs(self, draft_dir: str | Path) -> Path | None:
        """The directory of the ONNX graphs exported for the draft in `draft_dir`, when that is the draft this
        export was written with (its copy in the export, onnx.json `draft.path`) and it has graphs; else None."""
        draft = self.meta.get("draft") or {}
        graphs, path = draft.get("graphs_dir"), draft.get("path")
        if not graphs or not path or Path(draft_dir).resolve() != (self.path / path).resolve():
            return None
        return self.path / graphs

    def lm_head(self, final_hidden: torch.Tensor) -> torch.Tensor:
        head = self.embeddings().head
        return (final_hidden.float() @ head.T).float()

    def embeddings(self) -> TargetEmbeddings:
        """The fp32 embedding (and head, when untied) read straight from the graph's external weights file."""
        if self._embeddings is None:
            embed = _read_initializer(self.path / self.meta["graph"], "embed.weight")
            if self.meta.get("tied", True):
                head = embed
            elif "head_file" in self.meta:  # a quantized graph: its head is 4- or 8-bit, the fp32 copy beside it
                head = torch.from_numpy(np.load(self.path / self.meta["head_file"]))
            else:
                head = _read_initializer(self.path / self.meta["graph"], "lm_head.weight_t").T
            self._embeddings = TargetEmbeddings(embed, float(self.meta.get("embed_scale", 1.0)), head)
        return self._embeddings


def _read_initializer(graph: Path, name: str) -> torch.Tensor:
    """An externally stored initializer as a tensor, without loading the rest of the weights."""
    import onnx

    model = onnx.load(graph, load_external_data=False)
    tensor = next(t for t in model.graph.initializer if t.name == name)
    info = {e.key: e.value for e in tensor.external_data}
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
    count = int(np.prod(tensor.dims))
    data = np.fromfile(graph.parent / info["location"], dtype=dtype, count=count, offset=int(info.get("offset", 0)))
    return torch.from_numpy(data.reshape(tuple(tensor.dims)))


def session_options(num_threads: int, spinning: str = DEFAULT_SPINNING):
    """Intra-op threads = the engine's thread count, sequential execution, every graph optimization on.

    spinning (SPINNING_MODES): what an idle intra-op thread does between kernels. A decode step is ~300 small
    kernels, and waking a sleeping thread for each costs more than the kernel on a VM. "run" spins while a run is
    in progress and stops when it returns (ONNX Runtime's session.force_spinning_stop), so nothing spins between
    steps, when the engine's own Python, its servers and other processes need the cores; "always" also spins after
    a run until the pool's spin count runs out (it takes a core from everything else); "off" sleeps between kernels.
    bench.onnx_decode --designs measures them (export/DESIGN.md, "ONNX Runtime", has the numbers)."""
    import onnxruntime as ort

    if spinning not in SPINNING_MODES:
        raise ValueError(f"spinning must be one of {SPINNING_MODES}, got {spinning!r}")
    options = ort.SessionOptions()
    options.intra_op_num_threads = num_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0" if spinning == "off" else "1")
    options.add_session_config_entry("session.force_spinning_stop", "1" if spinning == "run" else "0")
    return options


def is_onnx_export(path: str | Path) -> bool:
    """True for a directory written by `python -m export --format onnx` (it holds onnx.json)."""
    return (Path(path) / META_FILE).is_file()


def load_onnx_target(
    engine_dir: str | Path,
    *,
    max_seq_len: int | None = None,
    num_threads: int | None = None,
    name: str | None = None,
    spinning: str | None = None,
    chat_template: str | None = None,
    for_chat: bool = False,
    batch_invariant: bool | None = None,
) -> OnnxTarget:
    """Open an exported ONNX target directory (graph, onnx.json, config.json, tokenizer) on CPU.
    spinning: see `session_options`; None = the DEEPSPEC_ORT_SPINNING environment variable (`spinning_mode`).
    batch_invariant: see the module docstring; None = the DEEPSPEC_BATCH_INVARIANT environment variable (default off).
    chat_template, for_chat: as `load_target`'s (the template replaces the exported tokenizer's own; a target left
    without one is refused before the session loads the graph)."""
    import onnxruntime as ort
    from transformers import AutoConfig, AutoTokenizer

    from deepspec.models.chat_templates import require_chat_template, resolve_chat_template

    root = Path(engine_dir)
    meta_file = root / META_FILE
    if not meta_file.is_file():
        raise FileNotFoundError(
            f"{root} holds no {META_FILE}: not an ONNX target export (python -m export --format onnx)"
        )
    meta = json.loads(meta_file.read_text())
    served_name: str = name or meta.get("target_name", root.name)
    config = AutoConfig.from_pretrained(root)
    spec = arch_spec_from_config(config)
    tokenizer = AutoTokenizer.from_pretrained(root)
    if chat_template is not None:
        tokenizer.chat_template = resolve_chat_template(chat_template)
    if for_chat:
        require_chat_template(tokenizer, served_name, spec.family)
    if batch_invariant is None:
        batch_invariant = _env_flag("DEEPSPEC_BATCH_INVARIANT")
    limit = min(max_seq_len or meta["max_positions"], meta["max_positions"])
    threads = num_threads or torch.get_num_threads()
    if spinning is None:
        spinning = spinning_mode()
    session = ort.InferenceSession(
        str(root / meta["graph"]), sess_options=session_options(threads, spinning), providers=["CPUExecutionProvider"]
    )
    return OnnxTarget(
        served_name, root, spec, tokenizer, session, meta, limit, tuple(meta["eos_token_ids"]), threads, batch_invariant
    )


def spinning_mode() -> str:
    """DEEPSPEC_ORT_SPINNING as a session_options mode: off/0, run, always/1; unset = DEFAULT_SPINNING. ValueError
    naming the accepted values for anything else (a typo must not silently change how every step runs)."""
    value = os.environ.get("DEEPSPEC_ORT_SPINNING", "").strip().lower()
    mode = {
        "": DEFAULT_SPINNING,
        "0": "off",
        "false": "off",
        "no": "off",
        "1": "always",
        "true": "always",
        "yes": "always",
    }.get(value, value)
    if mode not in SPINNING_MODES:
        raise ValueError(f"DEEPSPEC_ORT_SPINNING={value!r}: use one of {', '.join(SPINNING_MODES)} (or 0 / 1)")
    return mode


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "0").lower() not in ("", "0", "false", "no")
