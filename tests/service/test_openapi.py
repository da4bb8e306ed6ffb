"""The gateway answers as its /openapi.json says: schemathesis, bounded, against a gateway in front of a stub worker.

Hypothesis draws a few dozen requests per operation from the document, valid bodies and invalid ones, sends them and
checks every answer with schemathesis' checks: no 5xx, every status and content type documented (400, not FastAPI's
422), every JSON body matching its schema, invalid input refused.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

pytestmark = pytest.mark.integration

#: examples per operation and generation mode: enough to reach every field, bounded to keep this test near a minute
MAX_EXAMPLES = 15
#: what a schema cannot say: prompt + max_tokens must fit the served model's context (the stub's: 2,048 tokens)
MAX_TOKENS = 64
#: nor that a token-id prompt must be in the served model's vocabulary (the stub's: bytes)
VOCAB_SIZE = 256
#: nor how many sequences the workers' batches hold: n is capped (a stub worker without num_return_sequences gets n
#: requests, each up to MAX_TOKENS)
MAX_N = 2
#: nor that a structured-output spec compiles, or can be written in the stub's byte vocabulary at all (a grammar left
#: with no token to go on fails the engine's step: reported against deepspec/decoding/structured.py)
CONSTRAINTS = ("structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar")


def _in_vocab(value):
    """A token id (JSON's 2352.0 is an integer too) folded into the vocabulary; anything else as it is."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and float(value).is_integer():
        return int(value) % VOCAB_SIZE
    return value


def within_the_model(case):
    """A schema-valid request the served model can also hold: max_tokens capped (and set, where chat would default
    to the whole context), token ids taken into the vocabulary; and the rules between two fields kept, which a schema
    does not say: stream_options (which OpenAI allows only with `"stream": true`) sent with streaming on, top_logprobs
    with logprobs on (OpenAI's rule), max_tokens 0 with echo, a streamed batch cut to one prompt, n capped at MAX_N
    and best_of, which is accepted only equal to n, set to it; structured-output specs left out (response_format
    json_object kept: any JSON object compiles and the stub can write one); speculation off without a draft cap."""
    if isinstance(case.body, dict):
        for name in CONSTRAINTS:
            case.body.pop(name, None)
        response_format = case.body.get("response_format")
        if isinstance(response_format, dict) and (
            response_format.get("json_schema") or response_format.get("type") == "json_schema"
        ):
            del case.body["response_format"]
        speculation = case.body.get("speculation")
        if isinstance(speculation, dict) and speculation.get("mode") == "off":
            speculation.pop("max_draft_tokens", None)  # off drafts nothing: a cap beside it is a 400
        if case.body.get("stream_options") is not None:
            case.body["stream"] = True
        prompt = case.body.get("prompt")
        if isinstance(prompt, list):
            prompt = [[_in_vocab(i) for i in p] if isinstance(p, list) else _in_vocab(p) for p in prompt]
            streamed_batch = case.body.get("stream") and prompt and not isinstance(prompt[0], int)
            case.body["prompt"] = prompt[:1] if streamed_batch else prompt
        if "messages" in case.body and case.body.get("top_logprobs"):
            case.body["logprobs"] = True
        if "prompt" in case.body and case.body.get("max_tokens") == 0:
            case.body["echo"] = True
        if _is_number(case.body.get("n")):
            case.body["n"] = min(case.body["n"], MAX_N)
        if case.body.get("best_of") is not None:
            case.body["best_of"] = case.body.get("n", 1)
        if "max_tokens" not in case.body and "max_completion_tokens" not in case.body:
            case.body["max_tokens"] = MAX_TOKENS
        for name in ("max_tokens", "max_completion_tokens"):
            if _is_number(case.body.get(name)):
                case.body[name] = min(case.body[name], MAX_TOKENS)
    return case


def _is_number(value) -> bool:
    """An int or a float (JSON's 2352.0 is an integer too), never a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@pytest.fixture(scope="module")
def openapi_schema(gateway):
    return schemathesis.openapi.from_url(f"{gateway.url}/openapi.json")


def test_the_document_says_400_where_the_gateway_answers_400(openapi_schema):
    for path in ("/v1/completions", "/v1/chat/completions"):
        responses = openapi_schema.raw_schema["paths"][path]["post"]["responses"]
        assert "400" in responses and "422" not in responses
        assert responses["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
def test_the_gateway_answers_as_its_openapi_document_says(openapi_schema, mode):
    operations = [result.ok() for result in openapi_schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions", "/v1/models"}
    for operation in operations:
        if mode == GenerationMode.NEGATIVE and not len(operation.body):
            continue  # nothing to get wrong in a GET without parameters
        strategy = operation.as_strategy(generation_mode=mode)

        @given(case=strategy.map(within_the_model) if mode == GenerationMode.POSITIVE else strategy)
        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            # every health check; pyright reads iterating the enum through hypothesis' metaclass as the metaclass
            suppress_health_check=list(HealthCheck),  # pyright: ignore[reportArgumentType]
        )
        def check(case):
            case.call_and_validate(timeout=30)

        check()
