"""Render the GPU image tables in docker/README.md and helm/deepspec/README.md from docker/images.py.

    python helm/tools/images_docs.py            # rewrite both
    python helm/tools/images_docs.py --check    # exit 1 when either is stale (tests run this)

docker/images.py is the single source (tags, versions, requirements, the pin); each README keeps the generated text
between `<!-- images-table:begin -->` and `<!-- images-table:end -->`: docker/README.md every tag with what it
misses, the chart README the pin and the requirements behind it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling module, whether run or loaded by path
from regenerate import regenerate

REPO = Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- images-table:begin -->", "<!-- images-table:end -->"


def load_images():
    """docker/images.py as a module (loaded by path: `docker` is not a package, and the name would shadow the
    Docker SDK)."""
    spec = importlib.util.spec_from_file_location("deepspec_images", REPO / "docker" / "images.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"{REPO / 'docker' / 'images.py'} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def requirements_table(images) -> str:
    rows = ["| Requirement | Needs | Why | Upstream |", "| --- | --- | --- | --- |"]
    for r in images.REQUIREMENTS:
        rows.append(f"| `{r.name}` | {r.bounds} | {_cell(r.needed_by)} | {_cell(r.source)} |")
    return "\n".join(rows)


def images_table(images) -> str:
    rows = [
        "| NGC tag | Triton | TensorRT-LLM | TensorRT | CUDA | Driver >= | Python | Misses |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i in images.IMAGES:
        missing = ", ".join(f"`{line.split(':', 1)[0]}`" for line in images.unmet(i)) or "nothing"
        tag = f"**`{i.tag}`** (pinned)" if i.release == images.PINNED else f"`{i.tag}`"
        rows.append(
            f"| {tag} | {i.triton} | {i.tensorrt_llm} | {i.tensorrt} | {i.cuda} | {i.min_driver} | "
            f"{i.python} | {missing} |"
        )
    return "\n".join(rows)


def engine_images_table(images) -> str:
    rows = ["| `worker.runtime` | Image | Engine | Needs >= | Why | CUDA |", "| --- | --- | --- | --- | --- | --- |"]
    for e in images.ENGINE_IMAGES:
        rows.append(
            f"| `{e.runtime}` | `{e.reference}` | {e.version} | {e.min_version} | {_cell(e.needs)} | {e.cuda} |"
        )
    return "\n".join(rows)


def pinned_summary(images) -> str:
    p = images.pinned()
    return (
        f"Pinned: `{p.reference}` (Triton {p.triton}, TensorRT-LLM {p.tensorrt_llm}, TensorRT {p.tensorrt}, "
        f"CUDA {p.cuda}: GPU nodes need driver {p.min_driver} or newer, or CUDA forward compatibility)."
    )


def _replace_block(path: Path, body: str) -> str:
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path}: no {BEGIN} ... {END} block to fill")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{body}\n{END}{tail}"


def render() -> dict[Path, str]:
    """Path -> generated text of both READMEs."""
    images = load_images()
    docker_readme, chart_readme = REPO / "docker" / "README.md", REPO / "helm" / "deepspec" / "README.md"
    engines = "The engine images of `worker.runtime` vllm, sglang and trtllm-serve (`ENGINE_IMAGES`):"
    docker_body = "\n\n".join(
        [pinned_summary(images), requirements_table(images), images_table(images), engines, engine_images_table(images)]
    )
    chart_body = "\n\n".join([pinned_summary(images), requirements_table(images), engines, engine_images_table(images)])
    return {
        docker_readme: _replace_block(docker_readme, docker_body),
        chart_readme: _replace_block(chart_readme, chart_body),
    }


def main(argv: list[str] | None = None) -> int:
    return regenerate(render, argv, (__doc__ or "").partition("\n")[0], "helm/tools/images_docs.py")


if __name__ == "__main__":
    raise SystemExit(main())
