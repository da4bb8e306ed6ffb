"""NVIDIA's Triton + TensorRT-LLM images: what each `nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3` tag
carries, what DeepSpec needs from the image it runs on, and the tag the repository pins.

The one place these facts live, with the engine images the chart runs for `worker.runtime` vllm, sglang and
trtllm-serve (`ENGINE_IMAGES`). `docker/worker-gpu.Dockerfile` (the GPU worker's base) and the chart's
`worker.triton.image` name `PINNED`; `tests/docker/test_images.py` checks every image reference in the repository
against `IMAGES` and `REQUIREMENTS`; `python helm/tools/images_docs.py` renders the tables in docker/README.md and
helm/deepspec/README.md from here.

    python docker/images.py                  # the pinned tag, then each tag with the requirements it misses

`IMAGES` copies NVIDIA's release compatibility matrix (triton-inference-server/server,
docs/introduction/compatibility.md, "Container Name: trtllm-python-py3"); the Triton server version is that
release branch's TRITON_VERSION. A new NGC release is one new row, then a review of `PINNED`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields

from packaging.version import Version

REPOSITORY = "nvcr.io/nvidia/tritonserver"
#: the image flavour with TensorRT-LLM, its Triton backends and tensorrt (the other flavours lack them)
FLAVOUR = "trtllm-python-py3"


@dataclass(frozen=True)
class TritonImage:
    """One NGC release of the trtllm-python-py3 image, versions as NVIDIA's matrix gives them."""

    #: NGC release, `yy.mm`
    release: str
    #: Triton Inference Server
    triton: str
    tensorrt_llm: str
    tensorrt: str
    cuda: str
    #: the driver the image's CUDA needs (older drivers only with CUDA forward compatibility, data-centre GPUs)
    min_driver: str
    python: str

    @property
    def tag(self) -> str:
        return f"{self.release}-{FLAVOUR}"

    @property
    def reference(self) -> str:
        return f"{REPOSITORY}:{self.tag}"


#: newest first
IMAGES: tuple[TritonImage, ...] = tuple(
    TritonImage(*row)
    for row in (
        ("26.07", "2.71.0", "1.2.1", "10.14.1.48", "13.1.0.036", "590.44.01", "3.12.3"),
        ("26.06", "2.70.0", "1.2.1", "10.14.1.48", "13.1.0.036", "590.44.01", "3.12.3"),
        ("26.05", "2.69.0", "1.2.1", "10.14.1.48", "13.1.0.036", "590.44.01", "3.12.3"),
        ("26.04", "2.68.0", "1.2.1", "10.14.1.48", "13.1.0.036", "590.44.01", "3.12.3"),
        ("26.03", "2.67.0", "1.2.0", "10.14.1.48", "13.1.0.036", "590.44.01", "3.12.3"),
        ("26.02", "2.66.0", "1.1.0", "10.13.3.9", "13.0.2.006", "580.95.05", "3.12.3"),
        ("26.01", "2.65.0", "1.1.0", "10.13.3.9", "13.0.2.006", "580.95.05", "3.12.3"),
        ("25.12", "2.64.0", "1.1.0", "10.13.3.9", "13.0.2.006", "580.95.05", "3.12.3"),
        ("25.11", "2.63.0", "1.0.3.2510", "10.13.3.9", "13.0.2.006", "580.95.05", "3.12.3"),
        ("25.10", "2.62.0", "1.0.0", "10.11.0.33", "12.9.1.010", "575.57.08", "3.12.3"),
        ("25.09", "2.61.0", "1.0.0", "10.11.0.33", "12.9.1.010", "575.57.08", "3.12.3"),
        ("25.08", "2.60.0", "0.21.0", "10.11.0.33", "12.9.0.043", "575.51.03", "3.12.3"),
        ("25.07", "2.59.1", "0.20.0", "10.10.0.31", "12.9.0.036", "575.51.03", "3.12.3"),
        ("25.06", "2.59.0", "0.20.0", "10.10.0.31", "12.9.0.036", "575.51.03", "3.12.3"),
        ("25.05", "2.58.0", "0.19.0", "10.9.0.34", "12.8.1.012", "570.124.06", "3.12.3"),
        ("25.04", "2.57.0", "0.18.2", "10.9.0.34", "12.8.1.012", "570.124.06", "3.12.3"),
        ("25.03", "2.56.0", "0.18.0", "10.9.0.34", "12.8.1.012", "570.124.06", "3.12.3"),
        ("25.02", "2.55.0", "0.17.0.post1", "10.8.0.43", "12.8.0.038", "570.86.10", "3.12.3"),
        ("25.01", "2.54.0", "0.17.0", "10.8.0.43", "12.8.0.038", "570.86.10", "3.12.3"),
    )
)

#: the components a requirement can name (TritonImage fields that hold versions)
COMPONENTS = tuple(f.name for f in fields(TritonImage) if f.name not in ("release", "min_driver"))


@dataclass(frozen=True)
class Requirement:
    """A version range of one component that something DeepSpec exports or runs needs."""

    #: short id, used in messages
    name: str
    #: a TritonImage field (COMPONENTS)
    component: str
    #: lowest version that carries it (inclusive); None: no lower bound
    min_version: str | None
    #: first version that no longer carries it (exclusive); None: no upper bound
    below_version: str | None
    #: which part of DeepSpec depends on it, and how it breaks without it
    needed_by: str
    #: the upstream code or document the bound comes from
    source: str
    #: (repository file, text in it) that shows the use; the tests fail when the use is gone, so a requirement
    #: nothing needs any more is dropped instead of holding the pin back
    used_in: tuple[str, str]

    def met_by(self, image: TritonImage) -> bool:
        have = Version(getattr(image, self.component))
        low = self.min_version is None or have >= Version(self.min_version)
        high = self.below_version is None or have < Version(self.below_version)
        return low and high

    @property
    def bounds(self) -> str:
        parts = ([f">= {self.min_version}"] if self.min_version else []) + (
            [f"< {self.below_version}"] if self.below_version else []
        )
        return f"{self.component} {', '.join(parts)}"


REQUIREMENTS: tuple[Requirement, ...] = (
    Requirement(
        "tensorrt-aot-plugins",
        "tensorrt",
        "10.9",
        None,
        "plugins/tensorrt.py registers the verification ops with tensorrt.plugin.register / aot_impl (PTX compiled "
        "ahead of time); older TensorRT has no tensorrt.plugin.aot_impl and `import plugins.tensorrt` fails",
        "NVIDIA/TensorRT python/packaging/bindings_wheel/tensorrt/plugin/_lib.py `aot_impl` (TensorRT 10.9 release)",
        ("plugins/tensorrt.py", "trtp.aot_impl"),
    ),
    Requirement(
        "llmapi-eagle3-layers",
        "tensorrt_llm",
        "1.0.0",
        None,
        "export/drafts/eagle3.py names the captured target layers `eagle3_layers_to_capture` (output-of-layer ids) "
        "for the PyTorch backend's EAGLE-3 one-model path (`eagle3_one_model`)",
        "NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py `EagleDecodingConfig.eagle3_layers_to_capture`, "
        "`eagle3_one_model`; PR #6210 (July 2025) made the captured layers configurable before the 1.0 release "
        "(the 1.0.0 tag itself not read)",
        ("export/drafts/eagle3.py", "eagle3_layers_to_capture"),
    ),
    Requirement(
        "llmapi-speculative-rules",
        "tensorrt_llm",
        "1.2.0",
        "1.3",
        "export/drafts/eagle3.py writes `speculative_config` into trtllm-serve.yaml and the Triton model.yaml from "
        "export/trtllm_releases.py, which holds the LLM-API rules of 1.2.0 and 1.2.1 only: EAGLE-3 as "
        "`decoding_type: Eagle` + `eagle3_one_model: true` (1.2.x dispatches no `Eagle3`: `Invalid decoding type`) "
        "and `allow_advanced_sampling: true` (else the one-model path verifies sampled requests greedily); another "
        "release needs its own row read from its code first",
        "NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py at v1.2.1: `DecodingBaseConfig.from_dict` (the "
        "dispatch dict), `EagleDecodingConfig.spec_dec_mode`, `DecodingBaseConfig.allow_advanced_sampling`; "
        "`Eagle3DecodingConfig` exists only after 1.2",
        ("export/drafts/eagle3.py", "trtllm_releases.release()"),
    ),
    Requirement(
        "engine-flow",
        "tensorrt_llm",
        None,
        "1.3",
        "export --format tensorrt-llm writes build.sh (trtllm-build on the checkpoint) and --format triton-repo "
        "writes engine-repo/ for the C++ `tensorrtllm` Triton backend; TensorRT-LLM removed both after 1.2",
        "NVIDIA/TensorRT-LLM PRs #15763 (TensorRT examples), #15907 (TensorRT-engine Triton backend), #15918 and "
        "#16369 (legacy TensorRT backend), July 2026 on main",
        ("export/formats/tensorrt_llm.py", "trtllm-build"),
    ),
    Requirement(
        "llmapi-triton-model",
        "triton",
        "2.60.0",
        None,
        "export/triton/llmapi_model.py mirrors tensorrtllm_backend's LLM-API model (all_models/llmapi, Python "
        "backend, decoupled) and returns acceptance_rate / total_accepted_draft_tokens / total_draft_tokens, "
        "which that model first returns in 25.08 (Triton 2.60.0)",
        "triton-inference-server/tensorrtllm_backend r25.08 docs/llmapi.md (`sampling_param_return_perf_metrics`)",
        ("export/triton/llmapi_model.py", "total_accepted_draft_tokens"),
    ),
    Requirement(
        "cuda-sm80-sm90",
        "cuda",
        "12.0",
        None,
        "`python -m plugins build --arch 80,89,90` compiles the verification kernels for Ampere, Ada and Hopper; "
        "sm_90 comes out as sm_90a, an arch-specific target CUDA 12.0 introduced",
        "NVIDIA CUDA 12.0 release notes (sm_90a); triton-lang/triton third_party/nvidia/backend/compiler.py "
        "`sm_arch_from_capability`",
        ("plugins/__main__.py", "--arch 80,89,90"),
    ),
    Requirement(
        "python",
        "python",
        "3.11",
        None,
        "pyproject.toml requires-python >= 3.11; docker/requirements.py reads pyproject.toml with tomllib",
        "pyproject.toml `requires-python`",
        ("pyproject.toml", 'requires-python = ">=3.11"'),
    ),
)

#: the release the repository pins: the newest in IMAGES that meets every requirement
PINNED = "26.07"


@dataclass(frozen=True)
class EngineImage:
    """An engine's official server image, run by the chart for `worker.runtime` vllm, sglang or trtllm-serve on the
    launch script `python -m export` wrote; the tag is pinned here and in helm/deepspec/values.yaml
    (`worker.openai.<engine>.image`)."""

    #: `worker.runtime`
    runtime: str
    repository: str
    tag: str
    #: the engine release the tag carries
    version: str
    #: lowest release that serves what the export for this engine writes
    min_version: str
    #: what needs `min_version`, and the upstream code or release that shows it
    needs: str
    #: the CUDA the image is built on (GPU nodes need its driver)
    cuda: str

    @property
    def reference(self) -> str:
        return f"{self.repository}:{self.tag}"


#: one pinned image per engine runtime
ENGINE_IMAGES: tuple[EngineImage, ...] = (
    EngineImage(
        "vllm",
        "vllm/vllm-openai",
        "v0.31.0",
        "0.31.0",
        "0.25.0",
        "`--format vllm` writes `method: dspark` drafts (vllm-project/vllm PR #46995, merged June 2026, first in the "
        "0.25 releases) beside EAGLE-3 in the speculators layout (`eagle_aux_hidden_state_layer_ids`) and DFlash; the "
        "chart drains with `--shutdown-timeout` (PRs #34730 / #36666, 0.18.0)",
        "13.0 (the `-cu129` tag of the same release runs on CUDA 12.9 drivers)",
    ),
    EngineImage(
        "sglang",
        "lmsysorg/sglang",
        "v0.5.20",
        "0.5.20",
        "0.5.16",
        "`--format sglang` writes `--speculative-algorithm DSPARK` drafts, which SGLang serves from 0.5.16 "
        "(sgl-project/sglang PR #30261); EAGLE-3 as `LlamaForCausalLMEagle3` with `midlayer.*` and DFLASH load in "
        "earlier releases",
        "13.0 (SGLang retired its CUDA 12 images after v0.5.19-cu129)",
    ),
    EngineImage(
        "trtllm-serve",
        "nvcr.io/nvidia/tensorrt-llm/release",
        "1.2.1",
        "1.2.1",
        "1.2.0",
        "`--format tensorrt-llm` writes trtllm-serve.yaml with the 1.2.x `speculative_config` "
        "(`decoding_type: Eagle`, `eagle3_one_model: true`, `allow_advanced_sampling: true`: requirement "
        "`llmapi-speculative-rules` above, export/trtllm_releases.py PINNED); 1.2.1 is the TensorRT-LLM of the "
        "pinned Triton image, so one release serves both runtimes",
        "13.1",
    ),
)


def engine_image(runtime: str) -> EngineImage:
    """The pinned image of a `worker.runtime`; KeyError naming the runtimes that have one."""
    for image in ENGINE_IMAGES:
        if image.runtime == runtime:
            return image
    known = ", ".join(i.runtime for i in ENGINE_IMAGES)
    raise KeyError(f"no engine image for worker.runtime {runtime!r} (known: {known})")


def by_tag(tag: str) -> TritonImage:
    """`26.07-trtllm-python-py3` (or `26.07`) -> its row; KeyError naming the known tags otherwise."""
    release = tag.removesuffix(f"-{FLAVOUR}")
    for image in IMAGES:
        if image.release == release and tag in (release, image.tag):
            return image
    raise KeyError(
        f"{tag!r} is not in docker/images.py IMAGES (known: {', '.join(i.tag for i in IMAGES)}); "
        "add its row from NVIDIA's compatibility matrix, or pin a listed tag"
    )


def unmet(image: TritonImage) -> list[str]:
    """One line per requirement the image misses (empty: it carries everything DeepSpec uses)."""
    return [
        f"{r.name}: needs {r.bounds}, {image.tag} has {getattr(image, r.component)} ({r.needed_by})"
        for r in REQUIREMENTS
        if not r.met_by(image)
    ]


def pinned() -> TritonImage:
    return by_tag(PINNED)


def main() -> int:
    print(f"pinned: {pinned().reference}")
    for engine in ENGINE_IMAGES:
        print(f"  {engine.runtime:28} {engine.reference} ({engine.version}, needs >= {engine.min_version})")
    for image in IMAGES:
        missing = [line.split(":", 1)[0] for line in unmet(image)]
        print(f"  {image.tag:28} {'ok' if not missing else 'misses ' + ', '.join(missing)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
