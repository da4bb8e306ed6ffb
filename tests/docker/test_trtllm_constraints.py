"""docker/trtllm_constraints.py and the GPU image that uses it: DeepSpec installs into a venv that sees the base
image's packages, so without constraints pip replaces what TensorRT-LLM 1.2.1 pins (its requirements.txt pins
transformers 4.x and xgrammar 0.1.x, among others; `tensorrt_llm` imports them at build and serve time). The
constraints pin every tensorrt_llm requirement at the image's version; ours that need newer become venv-only
overrides, and the tensorrt_llm side runs on the image's interpreter."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path
from typing import cast

from tests.docker import load_script

REPO = Path(__file__).resolve().parents[2]


constraints = load_script("trtllm_constraints", REPO / "docker" / "trtllm_constraints.py")
requirements = load_script("deepspec_requirements", REPO / "docker" / "requirements.py")

#: what the GPU image's tensorrt_llm resolved, as its metadata would report it: a 4.x transformers and a 0.1.x
#: xgrammar (1.2.1's pins are older than ours) beside packages whose pins our ranges accept
IMAGE_PINS = {
    "transformers": "4.57.1",
    "xgrammar": "0.1.25",
    "numpy": "1.26.4",
    "pyyaml": "6.0.2",
    "pydantic": "2.11.7",
    "nvidia-nccl-cu13": "2.27.7",
}


def _ours() -> list[str]:
    """The lines the GPU image installs (worker-gpu.Dockerfile: --extras serve export --exclude torch)."""
    return requirements.requirements(REPO / "pyproject.toml", ["serve", "export"], ["torch"], [])


def test_pins_are_the_installed_versions_of_the_distributions_requirements():
    """Run on a distribution installed here (fastapi): each requirement that applies maps to its installed version,
    extras-only ones are left out."""
    pins = constraints.pinned_requirements("fastapi")
    assert pins and pins["starlette"] == metadata.version("starlette")
    assert all(metadata.version(name) == version for name, version in pins.items())


def test_every_pin_our_ranges_accept_is_kept_and_the_others_are_venv_only_overrides():
    kept, overrides = constraints.split(_ours(), IMAGE_PINS)
    assert {"numpy==1.26.4", "pyyaml==6.0.2", "pydantic==2.11.7", "nvidia-nccl-cu13==2.27.7"} == set(kept)
    assert sorted(line.split(">")[0] for line in overrides) == ["transformers", "xgrammar"]


def test_the_resolved_set_keeps_every_pin_but_the_overrides():
    """--verify's check on the venv's resolved versions: a pin replaced (numpy upgraded by a dependency of ours) is
    reported; the overrides and the untouched pins are not."""
    _, overrides = constraints.split(_ours(), IMAGE_PINS)
    resolved = {**IMAGE_PINS, "transformers": "5.2.0", "xgrammar": "0.2.9"}
    assert constraints.unmet(IMAGE_PINS, resolved, overrides) == []
    assert constraints.unmet(IMAGE_PINS, {**resolved, "numpy": "2.3.1"}, overrides) == [
        "numpy: TensorRT-LLM's image has 1.26.4, the venv resolves 2.3.1"
    ]
    assert constraints.unmet(IMAGE_PINS, resolved, []) != []  # without the overrides their upgrade is a replacement


def test_verify_reads_a_real_interpreters_resolved_set(tmp_path):
    pins = {"pyyaml": metadata.version("pyyaml"), "numpy": "0.0.1"}
    resolved = constraints._resolved_in(sys.executable, list(pins))
    assert resolved["pyyaml"] == pins["pyyaml"]
    assert constraints.unmet(pins, resolved, []) == [
        f"numpy: TensorRT-LLM's image has 0.0.1, the venv resolves {metadata.version('numpy')}"
    ]


def test_the_gpu_image_installs_under_the_constraints_and_runs_tensorrt_llm_on_the_images_interpreter():
    from tests.docker.test_dockerfiles import stages

    builder, runtime = stages(REPO / "docker" / "worker-gpu.Dockerfile")[1:]
    run = " ".join(args for keyword, args in builder if keyword == "RUN")
    assert '"$TRTLLM_PYTHON" trtllm_constraints.py requirements.txt > constraints.txt' in run
    assert "--requirement requirements.txt --constraint constraints.txt" in run
    assert "--verify /opt/venv/bin/python" in run
    runtime_env = " ".join(args for keyword, args in runtime if keyword == "ENV")
    assert "DEEPSPEC=/opt/deepspec" in runtime_env, "build.sh hands this folder to the TensorRT-LLM interpreter"
    for stage in (builder, runtime):
        env = " ".join(args for keyword, args in stage if keyword == "ENV")
        assert "TRTLLM_PYTHON=/usr/bin/python3" in env
    from types import SimpleNamespace

    from export.formats.tensorrt_llm import build_script
    from export.job import ExportJob

    # the three fields build_script reads; an ExportJob would need a real target
    script = build_script(cast(ExportJob, SimpleNamespace(num_speculative_tokens=3, draft=None, dtype="bfloat16")))
    assert '"${TRTLLM_PYTHON:-python}" -c' in script
