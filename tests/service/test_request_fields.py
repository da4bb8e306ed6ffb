"""Nothing is silently ignored: every field the chat and completions schemas accept is listed here as honoured (it
changes the worker request, or the answer's shape) or refused away from its neutral value, with a 400 naming it. A
field added to a schema without a line here fails the first test, so none can be accepted and then left unread.

OpenAI answers a field it does not know with "Unrecognized request argument"; vLLM accepts and drops it with a log
line (vllm-project/vllm vllm/entrypoints/openai/engine/protocol.py OpenAIBaseModel.__log_extra_fields__), which is
how a client asking for JSON or tool calls gets free text: here an unknown field is a 400 too.
"""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from service.gateway.errors import validation_message
from service.gateway.schemas import ChatCompletionRequest, CompletionRequest

CHAT_BASE = {"messages": [{"role": "user", "content": "hi"}]}
COMPLETION_BASE = {"prompt": "hi"}

#: shared by both APIs: field -> (the field set, what it needs alongside) for a request that differs from the base
SAMPLING = {
    "temperature": ({"temperature": 0.5}, {}),
    "top_p": ({"top_p": 0.5}, {}),
    "top_k": ({"top_k": 5}, {}),
    "seed": ({"seed": 3}, {}),
    "stop": ({"stop": ["x"]}, {}),
    "ignore_eos": ({"ignore_eos": True}, {}),
    "max_tokens": ({"max_tokens": 7}, {}),
    "n": ({"n": 2}, {}),  # n choices from one prompt (tests/service/test_n_choices.py)
    "response_format": ({"response_format": {"type": "json_object"}}, {}),
    "structured_outputs": ({"structured_outputs": {"regex": "[0-9]+"}}, {}),
    "guided_json": ({"guided_json": {"type": "object"}}, {}),
    "guided_regex": ({"guided_regex": "[0-9]+"}, {}),
    "guided_choice": ({"guided_choice": ["yes", "no"]}, {}),
    "guided_grammar": ({"guided_grammar": 'root ::= "a"'}, {}),
    "speculation": ({"speculation": {"mode": "off"}}, {}),  # tests/service/test_speculation.py
    "user": ({"user": "someone"}, {}),  # the session the router keeps on one worker (tests/service/test_routing.py)
}
#: fields that change the worker request (GenerationRequest), per API
CHAT_GENERATION = SAMPLING | {
    "messages": ({"messages": [{"role": "user", "content": "bye"}]}, {}),
    "max_completion_tokens": ({"max_completion_tokens": 7}, {}),
    "logprobs": ({"logprobs": True}, {}),
    "top_logprobs": ({"logprobs": True, "top_logprobs": 2}, {"logprobs": True}),
    "logprobs_mode": ({"logprobs_mode": "processed_logprobs"}, {"logprobs": True}),
}
COMPLETION_GENERATION = SAMPLING | {
    "prompt": ({"prompt": "bye"}, {}),
    "logprobs": ({"logprobs": 2}, {}),
    "echo": ({"echo": True, "logprobs": 1}, {"logprobs": 1}),  # the prompt's scores; the text is prepended too
    "logprobs_mode": ({"logprobs_mode": "processed_logprobs"}, {"logprobs": 1}),  # tests/service/test_logprobs.py
}
#: fields that shape the answer, not the worker request: how each is honoured
RESPONSE = {
    "model": "routes the request to the workers serving it (Dispatcher.resolve_model)",
    "stream": "SSE instead of one body",
    "stream_options": "include_usage adds the usage chunk",
}
COMPLETION_RESPONSE = RESPONSE | {"echo": "prepends the prompt to the text"}
#: accepted at any value and without effect, as at OpenAI
NO_EFFECT: dict[str, str] = {}
CHAT_NO_EFFECT = NO_EFFECT | {"parallel_tool_calls": "only about tool calls, and tools are refused"}
#: refused away from their neutral value: field -> a non-neutral value
REFUSED = {"presence_penalty": 0.5, "frequency_penalty": 0.5, "logit_bias": {"1": 1.0}}
CHAT_REFUSED = REFUSED | {"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto"}
COMPLETION_REFUSED = REFUSED | {"suffix": "x", "best_of": 2}  # best_of is accepted only equal to n

APIS = {
    "chat": (ChatCompletionRequest, CHAT_BASE, CHAT_GENERATION, RESPONSE, CHAT_NO_EFFECT, CHAT_REFUSED),
    "completions": (
        CompletionRequest,
        COMPLETION_BASE,
        COMPLETION_GENERATION,
        COMPLETION_RESPONSE,
        NO_EFFECT,
        COMPLETION_REFUSED,
    ),
}


def _generation(model, body: dict) -> dict:
    request = model.model_validate(body)
    return request.generation() if model is ChatCompletionRequest else request.generation(request.prompts[0])


@pytest.mark.parametrize("api", APIS)
def test_every_field_is_listed_as_honoured_or_refused(api):
    model, _, generation, response, no_effect, refused = APIS[api]
    assert set(model.model_fields) == set(generation) | set(response) | set(no_effect) | set(refused)


@pytest.mark.parametrize(("api", "field"), [(api, f) for api, spec in APIS.items() for f in spec[2]])
def test_each_generation_field_changes_the_worker_request(api, field):
    model, base, generation, *_ = APIS[api]
    changed, needs = generation[field]
    assert _generation(model, base | needs | changed) != _generation(model, base | needs)


@pytest.mark.parametrize(("api", "field"), [(api, f) for api, spec in APIS.items() for f in spec[4]])
def test_fields_without_effect_leave_the_worker_request_as_it_is(api, field):
    model, base, *_ = APIS[api]
    value = {"user": "someone", "parallel_tool_calls": False}[field]
    assert _generation(model, base | {field: value}) == _generation(model, base)


@pytest.mark.parametrize(("api", "field"), [(api, f) for api, spec in APIS.items() for f in spec[5]])
def test_each_refused_field_is_a_400_naming_it_away_from_its_neutral_value(api, field):
    model, base, *_, refused = APIS[api]
    with pytest.raises(ValidationError) as info:
        model.model_validate(base | {field: refused[field]})
    message, _ = validation_message(info.value.errors())
    assert re.search(rf"\b{field}\b", message), message


@pytest.mark.parametrize("api", APIS)
def test_an_unknown_field_is_a_400_naming_it(api):
    model, base, *_ = APIS[api]
    with pytest.raises(ValidationError) as info:
        model.model_validate(base | {"functions": []})
    message, param = validation_message(info.value.errors())
    assert param == "functions" and "unrecognized request argument" in message


@pytest.mark.parametrize("api", APIS)
def test_an_unknown_logprobs_mode_is_a_400_naming_the_valid_ones(api):
    """vLLM's two logprobs modes are taken (vllm/config/model.py LogprobsMode; its raw_logits and processed_logits
    return logits, not logprobs, and are not offered)."""
    model, base, *_ = APIS[api]
    with pytest.raises(ValidationError) as info:
        model.model_validate(base | {"logprobs_mode": "raw_logits"})
    message, param = validation_message(info.value.errors())
    assert param == "logprobs_mode" and "'raw_logprobs' or 'processed_logprobs'" in message
