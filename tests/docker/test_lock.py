"""The gateway and CPU worker images install the deepspec wheel and a locked dependency set (issue 43 item 2):
docker/locks/<image>.txt pins every package (pip has nothing to resolve, every build gets the same versions), the
pins are the versions the tests run with, and the Dockerfiles copy their own build context (wheel, locks), never the
source tree."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.docker import load_script
from tests.docker.test_dockerfiles import instructions

REPO = Path(__file__).resolve().parents[2]
lock = load_script("lock", REPO / "docker" / "lock.py")

WHEEL_IMAGES = ("gateway", "worker-cpu")


def pins(image: str) -> dict[str, str]:
    """Every pin the image installs: its lock and its no-deps lock."""
    lines = []
    for path in (REPO / "docker" / "locks").glob(f"{image}.*txt"):
        lines += path.read_text().splitlines()
    out = {}
    for line in lines:
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version and canonicalize_name(name) == name, f"not a name==version pin: {line!r}"
            out[name] = version
    return out


@pytest.mark.parametrize("image", WHEEL_IMAGES)
def test_every_requirement_of_the_image_is_pinned_and_met(image):
    pinned = pins(image)
    for requirement in lock.top_requirements(lock.IMAGES[image]):
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{image}: {requirement} is not in its lock"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"{image}: {requirement} vs {pinned[name]}"
        )


def test_the_locks_are_what_this_environment_holds():
    """The pins are the versions the suite runs with: a reinstalled .venv with other versions fails here until
    `make lock` rewrites them."""
    result = subprocess.run(
        [sys.executable, "docker/lock.py", "--check"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def test_the_gateway_lock_holds_no_model_code():
    assert not {"torch", "transformers", "xgrammar", "triton", "onnxruntime"} & set(pins("gateway"))
    assert pins("worker-cpu")["torch"].endswith("+cpu") and "triton" not in pins("worker-cpu")  # CUDA kernels only


def test_the_gateway_starts_with_only_its_lock():
    """Every distribution outside the gateway's lock is made unimportable (as in its image; optional imports such as
    grpc's grpc_tools fall back as they do there), then the gateway's modules import and its app is built."""
    script = f"""
import importlib.abc, importlib.metadata as md, sys
allowed = {set(pins("gateway"))!r}
owners = md.packages_distributions()
class OnlyTheLock(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        dists = {{d.lower().replace("_", "-") for d in owners.get(name.split(".")[0], [])}}
        if dists and "deepspec" not in dists and not dists & allowed:
            raise ModuleNotFoundError("not in the gateway image: " + name, name=name)
sys.meta_path.insert(0, OnlyTheLock())
import service.cli, service.gateway.app, service.gateway.worker_client
from service.gateway.app import create_app
from service.gateway.settings import GatewaySettings
create_app(GatewaySettings(workers="127.0.0.1:1"))
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_closure_follows_extras_and_markers():
    image = lock.ImageSet(extras=(), core=False, extra_requirements=("uvicorn[standard]>=0.30",))
    closed = lock.closure(image, lock.top_requirements(image))
    assert {"uvicorn", "httptools", "uvloop", "websockets", "watchfiles"} <= set(closed)
    plain = lock.ImageSet(extras=(), core=False, extra_requirements=("uvicorn>=0.30",))
    assert "httptools" not in lock.closure(plain, lock.top_requirements(plain))
    assert not lock._applies(Requirement("pywin32; sys_platform == 'win32'"), "")


@pytest.mark.parametrize("image", WHEEL_IMAGES)
def test_the_image_installs_the_wheel_and_its_lock_not_the_tree(image):
    steps = instructions(REPO / "docker" / f"{image}.Dockerfile")
    copies = [shlex.split(args) for keyword, args in steps if keyword == "COPY" and "--from=" not in args]
    assert copies == [[f"{d}/", f"/build/{d}/"] for d in ("locks", "wheels", "certs", "dist")] + [
        ["healthcheck.py", "/build/"]
    ], "only the image context of make images, dependencies before the wheel"
    runs = [args for keyword, args in steps if keyword == "RUN"]
    assert "--no-deps --find-links /build/wheels" in runs[0] and f"--requirement /build/locks/{image}.txt" in runs[0]
    assert "deepspec" not in runs[0], "the dependency layer must not change with the wheel"
    assert "pip install --no-deps --no-index /build/dist/deepspec-*.whl" in runs[1] and "pip check" in " ".join(runs)
    env = " ".join(args for keyword, args in steps if keyword == "ENV")
    assert "PYTHONPATH" not in env


def test_the_gpu_image_installs_the_wheel_apart_from_the_venv_not_the_tree():
    """Its dependencies cannot be locked here (they must fit the TensorRT-LLM of NVIDIA's base: see
    test_trtllm_constraints), but the product is the same wheel, in a folder of its own for build.sh's TensorRT-LLM
    interpreter."""
    steps = instructions(REPO / "docker" / "worker-gpu.Dockerfile")
    copies = [shlex.split(args) for keyword, args in steps if keyword == "COPY" and "--from=" not in args]
    assert copies == [
        ["gpu/", "/build/gpu/"],
        ["certs/", "/build/certs/"],
        ["dist/", "/build/dist/"],
        ["healthcheck.py", "/build/"],
    ], "dependencies before the wheel, nothing of the tree"
    runs = [args for keyword, args in steps if keyword == "RUN"]
    assert "deepspec" not in runs[1].replace("deepspec_requirements", ""), (
        "the dependency layer must not change with the wheel"
    )
    assert "pip install --no-deps --no-index --target /opt/deepspec /build/dist/deepspec-*.whl" in runs[2]
    assert "echo /opt/deepspec >" in runs[2] and ".pth" in runs[2]
    env = " ".join(args for keyword, args in steps if keyword == "ENV")
    assert "PYTHONPATH" not in env and "/app" not in " ".join(args for _, args in steps)


def test_make_images_assembles_the_context_the_dockerfiles_copy():
    makefile = (REPO / "Makefile").read_text()
    for line in (
        "cp $(DIST)/deepspec-*.whl $(IMAGE_CONTEXT)/dist/",
        "cp docker/locks/*.txt $(IMAGE_CONTEXT)/locks/",
        "cp docker/healthcheck.py $(IMAGE_CONTEXT)/",
        "cp pyproject.toml docker/requirements.py docker/trtllm_constraints.py $(IMAGE_CONTEXT)/gpu/",
    ):
        assert line in makefile, line
    assert "WHEEL_IMAGES     ?= gateway worker-cpu" in makefile
