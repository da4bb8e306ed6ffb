"""Files the Triton model repository ships (`--format triton-repo`): `llmapi_model.py` is the Python-backend
`model.py` that serves TensorRT-LLM's LLM API (with `speculative_config`) behind Triton."""

from pathlib import Path

#: the source of `tensorrt_llm/1/model.py`
LLMAPI_MODEL_PY = Path(__file__).with_name("llmapi_model.py")
