"""What each TensorRT-LLM release's LLM API accepts in `speculative_config`, and the release the repository pins.

The one table of those rules: the export writes `trtllm-serve.yaml` and the Triton LLM-API `model.yaml` from the row
of `PINNED`, docker/images.py pins the images that carry that release (its tests check that the Triton image and the
trtllm-serve image carry exactly `PINNED`), and the tests check every exported `speculative_config` against the row.
A new TensorRT-LLM in an image is a new row here, read from that release's own code, then a move of `PINNED`.

The rules come from NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py at the release's tag:

- `DecodingBaseConfig.from_dict` picks the config class from a fixed dict keyed by `decoding_type` and raises
  `ValueError("Invalid decoding type: ...")` for any other value. In 1.2.x that dict has no `Eagle3`:
  EAGLE-3 is `EagleDecodingConfig` (`decoding_type: Eagle`) with `eagle3_one_model: true`, whose `spec_dec_mode`
  turns into EAGLE3_ONE_MODEL. (`Eagle3DecodingConfig` and its `decoding_type: Eagle3` exist only after 1.2.)
- Every decoding config is a `StrictBaseModel`: a key the class does not declare is an error at start.
- `DecodingBaseConfig.allow_advanced_sampling` defaults to false, "only applicable to 1-model code paths": without
  it the one-model EAGLE-3 path verifies every request greedily, whatever temperature / top_p it asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the `decoding_type` values `DecodingBaseConfig.from_dict` dispatches on, 1.0 through 1.2.x
_DISPATCH_1_X = frozenset(
    {"MTP", "Medusa", "Eagle", "Lookahead", "NGram", "DraftTarget", "SaveState", "UserProvided", "AUTO"}
)
#: the `EagleDecodingConfig` fields (its own and `DecodingBaseConfig`'s) the export writes, all declared in 1.2.x
_EAGLE_FIELDS_1_2 = frozenset(
    {
        "decoding_type",
        "max_draft_len",
        "speculative_model_dir",
        "eagle3_one_model",
        "eagle3_layers_to_capture",
        "allow_advanced_sampling",
    }
)


@dataclass(frozen=True)
class LlmApiRelease:
    """One TensorRT-LLM release's LLM-API rules for speculative decoding (module docstring)."""

    version: str
    #: the keys of `DecodingBaseConfig.from_dict`'s dispatch dict
    decoding_types: frozenset[str]
    #: the keys that select EAGLE-3 on the one-model path (the `decoding_type` among them)
    eagle3_selector: tuple[tuple[str, object], ...]
    #: the keys of the EAGLE config class the export may write (StrictBaseModel: anything else is refused)
    eagle3_fields: frozenset[str]
    #: keys the one-model path needs so that sampled requests are sampled (`allow_advanced_sampling`)
    sampling_options: tuple[tuple[str, object], ...]

    @property
    def eagle3_decoding_type(self) -> str:
        """The `decoding_type` among eagle3_selector's keys: the release's name of EAGLE-3."""
        decoding_type = dict(self.eagle3_selector)["decoding_type"]
        if not isinstance(decoding_type, str):
            raise TypeError(f"TensorRT-LLM {self.version}: decoding_type {decoding_type!r} is not a string")
        return decoding_type

    def eagle3_keys(self) -> dict:
        """The speculative_config keys that select EAGLE-3 plus those that keep sampling sampled."""
        return {**dict(self.eagle3_selector), **dict(self.sampling_options)}

    def refusal(self, speculative_config: dict) -> str | None:
        """Why this release refuses `speculative_config` at start, as its `from_dict` and the class would; None:
        it accepts it."""
        decoding_type = speculative_config.get("decoding_type")
        if decoding_type not in self.decoding_types:
            return f"Invalid decoding type: {decoding_type}"
        unknown = sorted(set(speculative_config) - self.eagle3_fields)
        if unknown:
            return f"EagleDecodingConfig: extra fields not permitted: {unknown}"
        return None


_ONE_MODEL_EAGLE3 = (("decoding_type", "Eagle"), ("eagle3_one_model", True))
_SAMPLED = (("allow_advanced_sampling", True),)

#: version -> rules; every row read from that tag's llm_args.py
RELEASES: dict[str, LlmApiRelease] = {
    version: LlmApiRelease(version, _DISPATCH_1_X, _ONE_MODEL_EAGLE3, _EAGLE_FIELDS_1_2, _SAMPLED)
    for version in ("1.2.0", "1.2.1")
}

#: the TensorRT-LLM of the pinned Triton image (docker/images.py PINNED) and of the trtllm-serve image
PINNED = "1.2.1"


def release(version: str = PINNED) -> LlmApiRelease:
    """The rules of one release; KeyError naming the releases that have a row."""
    try:
        return RELEASES[version]
    except KeyError:
        raise KeyError(
            f"no LLM-API rules for TensorRT-LLM {version!r} in export/trtllm_releases.py (rows: "
            f"{', '.join(RELEASES)}): read that release's llm_args.py and add its row"
        ) from None
