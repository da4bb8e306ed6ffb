"""A KServe v2 worker without an engine that answers as deepspec_protocol/worker.py says a worker answers, several
choices (`num_return_sequences`, `sequence_index`) included: what the gateway's tests of `n` run against while the real
worker's support lands, and the rules they hold it to.

What it writes is a function of the request alone, so a test can say what each choice must read: sequence i of a
request draws from seed + i (seed 0 when unseeded, as if seeded with 0), and the sequence drawing from e writes
`max_tokens` words `e.k ` (k = 0, 1, ...), one fewer (but at least one) and finishing with "stop" when e is odd. A
fan-out of n requests with seeds s + i therefore reads exactly as one request for n sequences seeded s.

Streamed (`stream` true), each step sends one word of every unfinished sequence, one response each, interleaved;
whole (`stream` false, on ModelStreamInfer), one response per sequence when it finishes, the shortest first. Counts
are each sequence's own and cumulative, the prompt's (its characters) in all; each sequence's last response has its
`finish_reason`, and only the request's very last response `triton_final_response`. Logprobs: each word -0.5; the
prompt's table (one row per character) comes once, in the request's first response. ModelInfer refuses n > 1.
"""

from __future__ import annotations

import json

import grpc
from tritonclient.grpc import service_pb2_grpc

from deepspec_protocol import tensors
from deepspec_protocol import worker as p
from deepspec_protocol.token_scores import TokenScore, add_scores
from service.gateway.signature import DEEPSPEC_WORKER
from service.kserve_messages import ModelInferResponse, model_config_pb2, scalar, service_pb2

MODEL = "fake"
_CONFIG_DATATYPES = {
    "BYTES": model_config_pb2.TYPE_STRING,
    "INT32": model_config_pb2.TYPE_INT32,
    "BOOL": model_config_pb2.TYPE_BOOL,
    "FP32": model_config_pb2.TYPE_FP32,
    "UINT64": model_config_pb2.TYPE_UINT64,
}


def words(seed: int, max_tokens: int) -> list[str]:
    """What the sequence drawing from `seed` writes."""
    return [f"{seed}.{k} " for k in range(max(1, max_tokens - seed % 2))]


def finish_reason(seed: int) -> str:
    return "stop" if seed % 2 else "length"


class FakeWorker(service_pb2_grpc.GRPCInferenceServiceServicer):
    """`takes_n` False: a model that declares no `num_return_sequences` (a stock Triton model's config)."""

    def __init__(self, takes_n: bool = True):
        self.takes_n = takes_n
        #: every request's inputs, decoded (`tensors.read_inputs`)
        self.requests: list[dict[str, list]] = []
        self.server: grpc.aio.Server | None = None

    async def start(self) -> str:
        self.server = grpc.aio.server()
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(self, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return f"127.0.0.1:{port}"

    async def stop(self) -> None:
        assert self.server is not None, "stop() before start()"
        await self.server.stop(grace=0)

    async def ServerReady(self, request, context):
        return service_pb2.ServerReadyResponse(ready=True)

    async def RepositoryIndex(self, request, context):
        model = service_pb2.RepositoryIndexResponse.ModelIndex(name=MODEL, version="1", state="READY")
        return service_pb2.RepositoryIndexResponse(models=[model])

    async def ModelConfig(self, request, context):
        config = model_config_pb2.ModelConfig(
            name=MODEL,
            platform=p.WORKER_PLATFORM,
            max_batch_size=0,
            model_transaction_policy=model_config_pb2.ModelTransactionPolicy(decoupled=True),
            input=[
                model_config_pb2.ModelInput(
                    name=name, data_type=_CONFIG_DATATYPES[slot.datatype], dims=slot.dims, optional=slot.optional
                )
                for name, slot in DEEPSPEC_WORKER.inputs.items()
                if self.takes_n or name != p.NUM_RETURN_SEQUENCES
            ],
        )
        config.parameters[p.MAX_SEQ_LEN_PARAM].string_value = "4096"
        return service_pb2.ModelConfigResponse(config=config)

    async def ModelInfer(self, request, context):
        inputs = self._read(request)
        if scalar(inputs, p.NUM_RETURN_SEQUENCES, int, 1) > 1:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "num_return_sequences > 1 needs ModelStreamInfer")
        (response,) = self._whole(request, inputs)
        return response

    async def ModelStreamInfer(self, request_iterator, context):
        async for request in request_iterator:
            inputs = self._read(request)
            streamed = scalar(inputs, p.STREAM, bool, False)
            responses = self._steps(request, inputs) if streamed else self._whole(request, inputs)
            for response in responses:
                yield service_pb2.ModelStreamInferResponse(infer_response=response)

    def _read(self, request) -> dict[str, list]:
        inputs = tensors.read_inputs(request)
        self.requests.append(inputs)
        return inputs

    def _steps(self, request, inputs) -> list[ModelInferResponse]:
        """One response per word of each sequence, the sequences' interleaved step by step."""
        sequences = _sequences(inputs)
        responses = []
        for step in range(max(len(ws) for ws in sequences.values())):
            for index, ws in sequences.items():
                if step < len(ws):
                    responses.append(
                        _response(
                            request,
                            inputs,
                            index,
                            ws[step : step + 1],
                            step + 1,
                            step + 1 == len(ws),
                            prompt=not responses,
                        )
                    )
        _set_final(responses)
        return responses

    def _whole(self, request, inputs) -> list[ModelInferResponse]:
        """One response per sequence, with its whole text, in the order the sequences finish (shortest first)."""
        sequences = sorted(_sequences(inputs).items(), key=lambda item: (len(item[1]), -item[0]))
        responses = [
            _response(request, inputs, index, ws, len(ws), True, prompt=i == 0)
            for i, (index, ws) in enumerate(sequences)
        ]
        _set_final(responses)
        return responses


def _prompt(inputs: dict[str, list]) -> str:
    messages = scalar(inputs, p.EXTRA_MESSAGES_JSON, str)
    if messages is not None:
        return "".join(m["content"] for m in json.loads(messages))
    return scalar(inputs, p.TEXT_INPUT, str, "")


def _seed(inputs: dict[str, list], index: int) -> int:
    return scalar(inputs, p.SEED, int, 0) + index


def _sequences(inputs: dict[str, list]) -> dict[int, list[str]]:
    """Sequence index -> the words it writes."""
    max_tokens = scalar(inputs, p.MAX_TOKENS, int, 8)
    n = scalar(inputs, p.NUM_RETURN_SEQUENCES, int, 1)
    return {index: words(_seed(inputs, index), max_tokens) for index in range(n)}


def _response(
    request, inputs, index: int, ws: list[str], num_output_tokens: int, last: bool, prompt: bool
) -> ModelInferResponse:
    """Sequence `index`'s response carrying the words `ws`; `prompt`: the request's first, with the prompt's table."""
    response = service_pb2.ModelInferResponse(model_name=request.model_name, model_version="1", id=request.id)
    tensors.add_output(response, p.TEXT_OUTPUT, "".join(ws))
    stats = p.RequestStats(num_prompt_tokens=len(_prompt(inputs)), num_output_tokens=num_output_tokens)
    for field_name, tensor_name in p.STATS_OUTPUTS.items():
        tensors.add_output(response, tensor_name, getattr(stats, field_name))
    tensors.add_output(response, p.SEQUENCE_INDEX, index)
    if last:
        tensors.add_output(response, p.EXTRA_FINISH_REASON, finish_reason(_seed(inputs, index)))
    if scalar(inputs, p.RETURN_LOG_PROBS, bool, False):
        add_scores(response, p.OUTPUT_SCORES, [TokenScore(w, 7, -0.5) for w in ws])
    if prompt and p.EXTRA_PROMPT_LOGPROBS in inputs:
        text = _prompt(inputs)
        add_scores(
            response, p.PROMPT_SCORES, [TokenScore(c, ord(c), None if i == 0 else -1.0) for i, c in enumerate(text)]
        )
    return response


def _set_final(responses: list[ModelInferResponse]) -> None:
    for response in responses:
        tensors.set_bool_param(response, p.FINAL_RESPONSE_PARAM, response is responses[-1])
