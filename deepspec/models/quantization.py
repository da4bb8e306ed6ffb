"""How a target's matmul weights are held: the one list the loader, the training CLI and the worker's settings
(service/worker/settings.py) share.

Torch-free on purpose: the training CLI offers the choices before it imports torch.
"""

from typing import Literal, get_args

Quantization = Literal["auto", "none", "gguf"]
#: "none" = dense weights in the model dtype; "gguf" = a GGUF target's own 4-bit matmul weights (CPU, bf16);
#: "auto" = gguf where it applies (a GGUF target on CPU in bf16), else none
QUANTIZATIONS: tuple[str, ...] = get_args(Quantization)
