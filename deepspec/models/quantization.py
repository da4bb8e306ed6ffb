"""How a target's matmul weights are held: the one weight-format option every stage offers (the worker's and the
training CLI's `--quantization`, export's onnx bundles), with one set of values.

Torch-free on purpose: the training CLI offers the choices before it imports torch.

Which values apply depends on the backend (deepspec/models/backends.py `InferenceBackend.weight_formats`) or the
export format; a value that does not apply is refused, never ignored.
"""

from typing import Literal, get_args

WeightFormat = Literal["auto", "none", "gguf", "int8", "int4"]
#: "auto" = the backend's own choice (PyTorch: gguf where it applies; ONNX: the format fastest here; native: a GGUF's
#: 4-bit blocks, else int8); "none" = dense weights in the model dtype; "gguf" = a GGUF target's own 4-bit matmul
#: weights on torch's int4 kernel (CPU, bf16); "int8" = 8-bit weights per channel; "int4" = 4-bit blocks
WEIGHT_FORMATS: tuple[str, ...] = get_args(WeightFormat)

Quantization = Literal["auto", "none", "gguf"]
#: the values the PyTorch decoder (load_target) honours
QUANTIZATIONS: tuple[str, ...] = get_args(Quantization)
