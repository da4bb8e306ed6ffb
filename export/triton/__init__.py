"""Files the Triton model repository ships (`--format triton-repo`): `llmapi_model.py` is the Python-backend
`model.py` that serves TensorRT-LLM's LLM API (with `speculative_config`) behind Triton; the Triton contract
(`deepspec_protocol/triton_contract.py`, the tensor names the gateway sends) goes next to it, where model.py reads
it."""

from pathlib import Path

import deepspec_protocol.triton_contract as _contract

#: the source of `tensorrt_llm/1/model.py`
LLMAPI_MODEL_PY = Path(__file__).with_name("llmapi_model.py")
#: the source of `tensorrt_llm/1/triton_contract.py`: one table of names for the gateway, the exporter and model.py
CONTRACT_PY = Path(_contract.__file__)
