import pytest

from deepspec.models import load_target
from deepspec.models.arch import arch_spec_from_config


def test_unknown_alias_lists_the_known_ones():
    with pytest.raises(ValueError, match="smollm2-135m"):
        load_target("no-such-model")


def test_missing_gguf_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        load_target(str(tmp_path / "missing.gguf"))


def test_directory_without_config_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_target(str(tmp_path))


def test_unsupported_architecture_names_supported_families():
    from transformers import GPT2Config

    with pytest.raises(ValueError, match="unsupported target architecture 'gpt2'.*llama"):
        arch_spec_from_config(GPT2Config())


def test_bad_dtype_is_refused():
    with pytest.raises(ValueError, match="unknown dtype"):
        load_target("smollm2-135m", dtype="int3")


@pytest.mark.slow
def test_default_alias_loads_from_cache(smollm2):
    assert smollm2.spec.family == "llama" and smollm2.spec.num_layers == 30
    from deepspec.paths import cache_dir

    assert smollm2.path.parent == cache_dir() / "targets"
    assert (smollm2.path / "model.safetensors").is_file()
    assert 2 in smollm2.eos_token_ids  # <|im_end|>
    assert smollm2.default_feature_layers(5) == (1, 8, 15, 22, 28)
    fp = smollm2.fingerprint()
    assert fp["vocab_size"] == 49152 and len(fp["tokenizer_hash"]) == 16
