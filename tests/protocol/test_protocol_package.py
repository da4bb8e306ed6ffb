"""The worker protocol package (deepspec_protocol/) stands alone: every stage imports it, it imports nothing else of
DeepSpec, and each wire name and finish reason is spelled once (the worker's names are the Triton contract's)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import deepspec_protocol
from deepspec_protocol import triton_contract, worker

PACKAGE = Path(deepspec_protocol.__file__).parent
#: DeepSpec's other top-level packages, none of which the protocol may import
OURS = ("deepspec", "service", "export", "training", "loadtest", "plugins", "bench", "tests")


def _imports(path: Path) -> list[str]:
    modules = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.append(node.module)
    return modules


def test_the_package_imports_nothing_else_of_deepspec():
    offenders = [
        f"{path.relative_to(PACKAGE.parent)} imports {module}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for module in _imports(path)
        if module.split(".")[0] in OURS
    ]
    assert not offenders, offenders


def test_the_triton_contract_imports_only_the_standard_library():
    """export copies triton_contract.py beside the LLM-API model.py, where no other module of ours exists."""
    modules = {m.split(".")[0] for m in _imports(PACKAGE / "triton_contract.py")}
    assert modules <= set(sys.stdlib_module_names) | {"__future__"}, modules


def test_the_worker_names_load_without_tritonclient_or_any_stage():
    code = (
        "import sys, deepspec_protocol.worker, deepspec_protocol.triton_contract\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'tritonclient', 'grpc', 'numpy', 'torch', "
        "'deepspec', 'service', 'export', 'training', 'loadtest'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_worker_inputs_are_the_triton_contracts_ensemble_names():
    """One table: every input name the worker reads is the contract's ENSEMBLE_NAMES entry for its role."""
    pairs = {
        "TEXT_INPUT": "prompt",
        "MAX_TOKENS": "max_tokens",
        "STREAM": "stream",
        "TEMPERATURE": "temperature",
        "TOP_K": "top_k",
        "TOP_P": "top_p",
        "SEED": "seed",
        "STOP_WORDS": "stop",
        "END_ID": "end_id",
        "EXTRA_MESSAGES_JSON": "messages",
        "EXTRA_IGNORE_EOS": "ignore_eos",
        "RETURN_LOG_PROBS": "return_log_probs",
        "INPUT_IDS": "prompt_token_ids",
        "EXTRA_TOP_LOGPROBS": "top_logprobs",
        "EXTRA_PROMPT_LOGPROBS": "prompt_logprobs",
        "EXTRA_LOGPROBS_MODE": "logprobs_mode",
        "EXTRA_STRUCTURED_OUTPUT": "structured_output",
        "NUM_RETURN_SEQUENCES": "num_return_sequences",
        "EXTRA_MAX_DRAFT_TOKENS": "max_draft_tokens",
        "EXTRA_SERVICE_CLASS": "service_class",
        "EXTRA_SESSION": "memory_session",
    }
    assert {name: getattr(worker, name) for name in pairs} == {
        name: triton_contract.ENSEMBLE_NAMES[role] for name, role in pairs.items()
    }


def test_one_finish_reason_table():
    """The wire names existed twice, with "abort" in the worker's and "cancelled" in the contract's: one set now,
    and TensorRT-LLM's own values map into it."""
    assert worker.EXTRA_FINISH_REASON == triton_contract.FINISH_REASON
    assert worker.TEXT_OUTPUT == triton_contract.TEXT_OUTPUT
    assert worker.FINISH_REASONS is triton_contract.FINISH_REASONS == ("stop", "length", "abort")
    assert set(triton_contract.TRTLLM_FINISH_REASONS.values()) <= set(triton_contract.FINISH_REASONS)
