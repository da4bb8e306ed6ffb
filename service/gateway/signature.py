"""What a served model accepts, read from its ModelConfig, and the KServe v2 request a generation becomes for it.

Triton checks every request against the model's config.pbtxt before the model sees it: an input the config does not
declare is refused, a shape must be the declared `dims` (with `-1` any length) behind one leading batch dimension
when `max_batch_size > 0` and without it when `max_batch_size` is 0, a required input must be present, and a
decoupled model answers only the streaming RPC. So the gateway reads each model's config once (`ModelSignature`)
and builds requests that pass those rules, in the dialect the model declares (`deepspec_protocol/triton_contract.py`:
the LLM-API model's `sampling_param_*` names, or the ensemble's, which DeepSpec's worker speaks too).

A request that needs an input the model does not declare (chat messages on a model without `messages_json`, stop
strings, `ignore_eos`, logprobs, processed logprobs, a token-id prompt, a structured output) is refused with
`SignatureError` naming the model and the input, instead of being sent and refused by Triton or silently changing
meaning. Request flags that only ask for outputs are sent when declared. Several sequences (`n`) are sent as
`num_return_sequences` only to a model that declares it (`ModelSignature.takes_n`); the dispatcher asks any other
for them one request each.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from deepspec_protocol import tensors
from deepspec_protocol import triton_contract as c
from deepspec_protocol import worker as p
from service.kserve_messages import ModelConfig, ModelInferRequest, model_config_pb2, service_pb2

#: roles a model may leave out without changing what the request means
_SKIPPABLE = frozenset(c.FLAGS) | {"stream", *c.ADVISORY}


class SignatureError(ValueError):
    """The request needs an input the model does not declare, or does not fit a declared shape."""


@dataclass(frozen=True)
class InputSlot:
    #: KServe v2 datatype
    datatype: str
    #: as config.pbtxt declares them, without the batch dimension
    dims: tuple[int, ...]
    optional: bool


@dataclass(frozen=True)
class ModelSignature:
    """The inputs one model declares, its batch dimension and whether it streams (decoupled)."""

    inputs: dict[str, InputSlot]
    max_batch_size: int
    decoupled: bool
    #: unary ModelInfer answered: Triton refuses it on a decoupled model; DeepSpec's worker answers both RPCs
    unary: bool
    #: each streamed `text_output` is the whole text so far (the stock LLM-API model), not the new text
    cumulative_text: bool = False

    @classmethod
    def from_config(cls, config: ModelConfig) -> ModelSignature:
        def datatype(data_type: int) -> str:
            name = model_config_pb2.DataType.Name(data_type)
            return "BYTES" if name == "TYPE_STRING" else name.removeprefix("TYPE_")

        inputs = {i.name: InputSlot(datatype(i.data_type), tuple(i.dims), i.optional) for i in config.input}
        decoupled = config.model_transaction_policy.decoupled
        unary = not decoupled or config.platform == p.WORKER_PLATFORM
        delta = (
            config.parameters[c.TEXT_OUTPUT_MODE].string_value == c.TEXT_DELTA
            if c.TEXT_OUTPUT_MODE in config.parameters
            else False
        )
        cumulative = c.LLMAPI_MARKER in inputs and not delta
        return cls(inputs, config.max_batch_size, decoupled, unary, cumulative)

    @property
    def takes_n(self) -> bool:
        """One request may ask for several sequences (`num_return_sequences`, TensorRT-LLM's name): the model
        prefills the prompt once for all of them. A model without it gets n requests (`service/gateway/fanout.py`)."""
        return self.names["num_return_sequences"] in self.inputs

    @property
    def names(self) -> dict[str, str | None]:
        """Role -> input name in this model's dialect."""
        return c.LLMAPI_NAMES if c.LLMAPI_MARKER in self.inputs else c.ENSEMBLE_NAMES

    def shape(self, name: str, num_values: int) -> list[int]:
        """The shape Triton accepts for `num_values` values of input `name`."""
        dims = self.inputs[name].dims
        if sum(d == -1 for d in dims) > 1 or any(d != -1 and d != 1 for d in dims[:-1]):
            raise SignatureError(
                f"input {name!r} has dims {list(dims)}: one value list per request is all this gateway sends"
            )
        shape = list(dims)
        if shape and shape[-1] == -1:
            shape[-1] = num_values
        elif num_values != (shape[-1] if shape else 1):
            raise SignatureError(
                f"input {name!r} takes {shape[-1] if shape else 1} value(s) (dims {list(dims)}), "
                f"the request has {num_values}"
            )
        return [1] + shape if self.max_batch_size > 0 else shape


def _worker_slot(role: str) -> InputSlot:
    return InputSlot(c.ROLE_DATATYPES[role], (1, -1) if role in c.LIST_ROLES else (1, 1), role != "prompt")


#: DeepSpec's worker as its ModelConfig describes it (ensemble names and additions, [1, n] tensors); what a request
#: is built for when a worker's config is unknown
DEEPSPEC_WORKER = ModelSignature(
    inputs={name: _worker_slot(role) for role, name in c.ENSEMBLE_NAMES.items() if name and role not in c.FLAGS},
    max_batch_size=0,
    decoupled=True,
    unary=True,
)


def request_values(req, stream: bool) -> dict[str, list | None]:
    """Role -> the values a GenerationRequest sends for it (None: nothing to send)."""
    return {
        "prompt": [req.prompt or ""],
        "messages": None if req.messages is None else [json.dumps(req.messages, ensure_ascii=False)],
        "max_tokens": None if req.max_tokens is None else [req.max_tokens],
        "stream": [stream],
        "temperature": [req.temperature],
        "top_p": [req.top_p],
        "top_k": [req.top_k],
        "seed": None if req.seed is None else [req.seed],
        "stop": list(req.stop) or None,
        "ignore_eos": [True] if req.ignore_eos else None,
        "prompt_token_ids": req.prompt_token_ids,
        "return_log_probs": None if req.logprobs is None else [True],
        "top_logprobs": None if req.logprobs is None else [req.logprobs],
        "prompt_logprobs": None if req.prompt_logprobs is None else [req.prompt_logprobs],
        "logprobs_mode": None if req.sent_logprobs_mode is None else [req.sent_logprobs_mode],
        "structured_output": None if req.structured_output is None else [req.structured_output.encode()],
        "num_return_sequences": None if req.n == 1 else [req.n],
        "max_draft_tokens": None if req.max_draft_tokens is None else [req.max_draft_tokens],
        "service_class": None if req.service_class == p.DEFAULT_SERVICE_CLASS else [req.service_class],
        "memory_session": None if req.memory_session is None else [req.memory_session],
        **{flag: [True] for flag in c.FLAGS},
    }


def build_request(req, stream: bool, signature: ModelSignature) -> ModelInferRequest:
    """The ModelInferRequest for `req` that `signature`'s model accepts; SignatureError when there is none."""
    request = service_pb2.ModelInferRequest(model_name=req.model, id=req.request_id)
    names, sent = signature.names, set()
    for role, values in request_values(req, stream).items():
        name = names.get(role)
        if values is None or (role in _SKIPPABLE and name not in signature.inputs):
            continue
        if name not in signature.inputs and role in c.FEATURE_OF_ROLE:
            raise SignatureError(
                f"{c.FEATURE_OF_ROLE[role]} are not supported by this worker: model {req.model!r} "
                f"declares no {name or role!r} input (DeepSpec's worker does)"
            )
        if name not in signature.inputs:
            raise SignatureError(
                f"model {req.model!r} declares no input for {role.replace('_', ' ')} "
                f"({name or 'none in its dialect'}): send the request without it"
            )
        slot = signature.inputs[name]
        request.inputs.add(name=name, datatype=slot.datatype, shape=signature.shape(name, len(values)))
        request.raw_input_contents.append(tensors.encode(slot.datatype, values))
        sent.add(name)
    missing = [name for name, slot in signature.inputs.items() if not slot.optional and name not in sent]
    if missing:
        raise SignatureError(
            f"model {req.model!r} requires {missing}: set them on the request (max_tokens has no default on this model)"
        )
    if signature.decoupled:  # a final flag sent without a response still ends the stream
        request.parameters["triton_enable_empty_final_response"].bool_param = True
    return request
