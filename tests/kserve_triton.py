"""An in-process Triton for tests: a KServe v2 gRPC server that loads an exported model repository's config.pbtxt,
checks every request the way Triton does, and runs the repository's Python-backend `model.py` with stand-ins for
`triton_python_backend_utils`, `tensorrt_llm` and `mpi4py` (none installs on a CPU machine).

Triton's rules enforced here, each where Triton enforces it:

- `ModelInfer` on a decoupled model fails UNIMPLEMENTED, "ModelInfer RPC doesn't support models with decoupled
  transaction policy" (triton-inference-server/server src/grpc/infer_handler.cc, ModelInferHandler::Execute).
- an input the config does not declare, a required input left out, a datatype other than the declared one, or a
  shape other than the declared dims (behind one batch dimension of 1..max_batch_size when max_batch_size > 0,
  without one when it is 0) is INVALID_ARGUMENT (triton-inference-server/core src/infer_request.cc,
  InferenceRequest::Normalize / ValidateRequestInputs; src/model.cc Model::GetInput, "unexpected inference input").
- a stream response carries `triton_final_response`; a final flag sent without a response reaches the client only
  when the request set `triton_enable_empty_final_response` (server src/grpc/stream_infer_handler.cc).
- a response output the config does not declare is an error (the Python backend checks the model's outputs).
- a client that cancels its stream makes `request.is_cancelled()` true for the model.

The scripted `tensorrt_llm.LLM` behaves as TensorRT-LLM's does where the model depends on it: `generate_async`
returns one GenerationResult that every step mutates in place and `__anext__` returns itself
(tensorrt_llm/executor/result.py GenerationResult.__anext__, CompletionOutput.text_diff), `abort()` ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import sys
import threading
import types
from pathlib import Path
from typing import Any, TypeAlias

import grpc
import numpy as np
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as _model_config_pb2
from tritonclient.grpc import service_pb2 as _service_pb2
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor, triton_to_np_dtype

# protobuf builds these modules' message classes at import time and tritonclient ships no stubs for them, so the
# type checker sees none of their attributes: the modules, and the messages this server handles, are Any to it
model_config_pb2: Any = _model_config_pb2
service_pb2: Any = _service_pb2
ModelConfig: TypeAlias = Any  # model_config_pb2.ModelConfig
ModelInferRequest: TypeAlias = Any  # service_pb2.ModelInferRequest
ModelInferResponse: TypeAlias = Any  # service_pb2.ModelInferResponse

FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL
WORDS = ("alpha", " beta", " gamma", " delta", " epsilon", " zeta", " eta", " theta")
#: per scripted step: draft tokens proposed and accepted (so a finished request has non-zero counters)
DRAFTED_PER_STEP, ACCEPTED_PER_STEP = 4, 3
#: a prompt the scripted LLM answers forever, one step every SLOW_STEP_S, until aborted
SLOW_PROMPT, SLOW_STEP_S = "slow", 0.02


# -- triton_python_backend_utils ---------------------------------------------------------------------------------


class Tensor:
    def __init__(self, name, array):
        self._name, self._array = name, np.asarray(array)

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array


class TritonError:
    CANCELLED, INTERNAL, INVALID_ARG = "CANCELLED", "INTERNAL", "INVALID_ARG"

    def __init__(self, message, code="INTERNAL"):
        self._message, self._code = message, code

    def message(self):
        return self._message

    def code(self):
        return self._code


class InferenceResponse:
    def __init__(self, output_tensors=None, error=None):
        self.output_tensors, self.error = list(output_tensors or ()), error


class Request:
    """What the Python backend hands `execute`: named input tensors, a response sender, the cancellation flag."""

    def __init__(self, inputs: dict[str, np.ndarray], request_id: str, sender):
        self._inputs, self._id, self._sender = inputs, request_id, sender
        self.cancelled = threading.Event()

    def inputs(self):
        return [Tensor(n, a) for n, a in self._inputs.items()]

    def request_id(self):
        return self._id

    def get_response_sender(self):
        return self._sender

    def is_cancelled(self):
        return self.cancelled.is_set()


def stand_in_module(name: str, **attributes: object) -> types.ModuleType:
    """A module named `name` holding `attributes`: what the code under test imports from the real one."""
    module = types.ModuleType(name)
    vars(module).update(attributes)
    return module


def pb_utils_module() -> types.ModuleType:
    return stand_in_module(
        "triton_python_backend_utils",
        Tensor=Tensor,
        InferenceResponse=InferenceResponse,
        TritonError=TritonError,
        TRITONSERVER_RESPONSE_COMPLETE_FINAL=FINAL,
        get_input_tensor_by_name=lambda request, name: next((t for t in request.inputs() if t.name() == name), None),
        using_decoupled_model_transaction_policy=lambda config: bool(
            config.get("model_transaction_policy", {}).get("decoupled")
        ),
    )


# -- tensorrt_llm and mpi4py -------------------------------------------------------------------------------------


class Completion:
    """TensorRT-LLM's CompletionOutput: cumulative text and token ids; text_diff is what the last step added."""

    def __init__(self):
        self.text, self.token_ids, self._last_text_len = "", [], 0
        self.finish_reason: str | None = None
        self.request_perf_metrics = types.SimpleNamespace(
            speculative_decoding=types.SimpleNamespace(
                acceptance_rate=0.0, total_accepted_draft_tokens=0, total_draft_tokens=0
            )
        )

    @property
    def text_diff(self):
        return self.text[self._last_text_len :]


class GenerationResult:
    """One object for the whole request, mutated by every step; iterating returns itself."""

    def __init__(self, prompt: str, params, prompt_token_ids: list[int]):
        self.prompt, self.params, self.prompt_token_ids = prompt, params, prompt_token_ids
        self.outputs, self.finished, self.aborted = [Completion()], False, False
        self.num_steps = 0

    def _step(self) -> None:
        out, spec = self.outputs[0], self.outputs[0].request_perf_metrics.speculative_decoding
        out._last_text_len = len(out.text)
        out.text += WORDS[self.num_steps % len(WORDS)]
        out.token_ids.append(100 + self.num_steps)
        self.num_steps += 1
        spec.total_draft_tokens += DRAFTED_PER_STEP
        spec.total_accepted_draft_tokens += ACCEPTED_PER_STEP
        spec.acceptance_rate = spec.total_accepted_draft_tokens / spec.total_draft_tokens
        if self.prompt != SLOW_PROMPT and self.num_steps >= self.params.max_tokens:
            self.finished, out.finish_reason = True, "length"

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.finished:
            raise StopAsyncIteration
        if self.prompt == SLOW_PROMPT:
            await asyncio.sleep(SLOW_STEP_S)
        if self.aborted:
            self.finished, self.outputs[0].finish_reason = True, "cancelled"
            return self
        self._step()
        return self

    async def aresult(self):
        async for _ in self:
            pass
        return self

    def abort(self):
        self.aborted = True


class ScriptedLLM:
    instances: list = []

    def __init__(self, **kwargs):
        self.kwargs, self.calls, self.closed = kwargs, [], False
        self.tokenizer = types.SimpleNamespace(
            apply_chat_template=lambda messages, tokenize, add_generation_prompt: (
                "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"
            )
        )
        ScriptedLLM.instances.append(self)

    def generate_async(self, prompt, params, streaming=False):
        self.calls.append((prompt, params, streaming))
        if prompt == "boom":
            raise RuntimeError("engine fell over")
        return GenerationResult(prompt, params, list(range(len(prompt))))

    def shutdown(self):
        self.closed = True


class DecodingBaseConfig:
    @staticmethod
    def from_dict(d):
        draft = d.get("speculative_model_dir", d.get("speculative_model"))
        return ("decoding-config", d["decoding_type"], d["max_draft_len"], draft)


class FakeMPI:
    """COMM_WORLD of `size` ranks seen from `rank`; records the sessions and executors the model opens."""

    def __init__(self, rank: int = 0, size: int = 1):
        self.rank, self.size, self.sessions, self.executors = rank, size, [], 0

    def Get_size(self):
        return self.size

    def Get_rank(self):
        return self.rank


def fake_modules(mpi: FakeMPI | None = None) -> dict[str, types.ModuleType]:
    """sys.modules entries for tensorrt_llm (scripted LLM), mpi4py (`mpi`) and triton_python_backend_utils."""
    fake_mpi = mpi or FakeMPI()

    def session(comm, n_workers):
        fake_mpi.sessions.append((comm, n_workers))
        return ("mpi-session", n_workers)

    @contextlib.contextmanager
    def executor(comm):
        fake_mpi.executors += 1
        yield None if comm.Get_rank() != 0 else object()  # as mpi4py: the executor lives on the root only

    return {
        "tensorrt_llm": stand_in_module(
            "tensorrt_llm", LLM=ScriptedLLM, SamplingParams=lambda **kw: types.SimpleNamespace(**kw)
        ),
        "tensorrt_llm._utils": stand_in_module(
            "tensorrt_llm._utils", global_mpi_rank=lambda: fake_mpi.rank, global_mpi_size=lambda: fake_mpi.size
        ),
        "tensorrt_llm.llmapi": stand_in_module("tensorrt_llm.llmapi", MpiCommSession=session),
        "tensorrt_llm.llmapi.llm_args": stand_in_module(
            "tensorrt_llm.llmapi.llm_args", DecodingBaseConfig=DecodingBaseConfig
        ),
        "mpi4py": stand_in_module("mpi4py"),
        "mpi4py.MPI": stand_in_module("mpi4py.MPI", COMM_WORLD=fake_mpi),
        "mpi4py.futures": stand_in_module("mpi4py.futures", MPICommExecutor=executor),
        "triton_python_backend_utils": pb_utils_module(),
    }


def load_model_py(path: Path):
    spec = importlib.util.spec_from_file_location(f"triton_model_{abs(hash(str(path)))}", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_config(path: Path) -> ModelConfig:
    return text_format.Parse(Path(path).read_text(), model_config_pb2.ModelConfig())


def initialize(model_dir: Path, config: ModelConfig, version: str = "1"):
    """model.py's TritonPythonModel, initialized as the Python backend does (sys.modules must hold the fakes)."""
    model = load_model_py(model_dir / version / "model.py").TritonPythonModel()
    model.initialize(
        {
            "model_config": json.dumps(json_format.MessageToDict(config, preserving_proto_field_name=True)),
            "model_repository": str(model_dir),
            "model_version": version,
            "model_name": config.name,
        }
    )
    return model


# -- the KServe v2 server ----------------------------------------------------------------------------------------


class Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code, self.message = code, message


def _datatype(data_type: int) -> str:
    name = model_config_pb2.DataType.Name(data_type)
    return "BYTES" if name == "TYPE_STRING" else name.removeprefix("TYPE_")


def check_request(config: ModelConfig, request: ModelInferRequest) -> dict[str, np.ndarray]:
    """The inputs of `request` as arrays, after Triton's checks against `config`; Refused when one fails."""
    model, declared = config.name, {i.name: i for i in config.input}
    sent = {}
    for tensor in request.inputs:
        if tensor.name not in declared:
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT, f"unexpected inference input '{tensor.name}' for model '{model}'"
            )
        spec = declared[tensor.name]
        if tensor.datatype != _datatype(spec.data_type):
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"inference input '{tensor.name}' data-type is '{tensor.datatype}', but model '{model}' "
                f"expects '{_datatype(spec.data_type)}'",
            )
        shape, dims = list(tensor.shape), list(spec.dims)
        if config.max_batch_size > 0:
            if not shape or not 1 <= shape[0] <= config.max_batch_size:
                raise Refused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"inference request batch-size must be <= "
                    f"{config.max_batch_size} for '{model}' (input '{tensor.name}' has shape {shape})",
                )
            shape = shape[1:]
        if len(shape) != len(dims) or any(d != -1 and d != s for d, s in zip(dims, shape)):
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"unexpected shape for input '{tensor.name}' for model '{model}'. Expected {dims}, got "
                f"{list(tensor.shape)}",
            )
        sent[tensor.name] = tensor
    missing = [n for n, spec in declared.items() if not spec.optional and n not in sent]
    if missing:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"expected required inputs {missing} for model '{model}'")
    if len(request.raw_input_contents) != len(request.inputs):
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "every input must come as raw_input_contents")
    arrays = {}
    for tensor, raw in zip(request.inputs, request.raw_input_contents):
        if tensor.datatype == "BYTES":
            values = deserialize_bytes_tensor(raw)
        else:
            values = np.frombuffer(raw, dtype=triton_to_np_dtype(tensor.datatype))
        if values.size != int(np.prod(tensor.shape)):
            raise Refused(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"input '{tensor.name}' holds {values.size} values for shape {list(tensor.shape)}",
            )
        arrays[tensor.name] = values.reshape(list(tensor.shape))
    return arrays


def to_kserve(config: ModelConfig, request: ModelInferRequest, response: InferenceResponse) -> ModelInferResponse:
    """A Python-backend response as Triton sends it; Refused (INTERNAL) for an output the config does not declare."""
    declared = {o.name: _datatype(o.data_type) for o in config.output}
    out = service_pb2.ModelInferResponse(model_name=config.name, model_version="1", id=request.id)
    for tensor in response.output_tensors:
        if tensor.name() not in declared:
            raise Refused(
                grpc.StatusCode.INTERNAL,
                f"model '{config.name}' returned output '{tensor.name()}', which its config does not declare",
            )
        array, datatype = tensor.as_numpy(), declared[tensor.name()]
        out.outputs.add(name=tensor.name(), datatype=datatype, shape=list(array.shape))
        if datatype == "BYTES":
            out.raw_output_contents.append(serialize_byte_tensor(array).item() if array.size else b"")
        else:
            out.raw_output_contents.append(array.astype(triton_to_np_dtype(datatype)).tobytes())
    return out


class _Sender:
    """The response sender: hands responses to the gRPC call's queue from whatever thread the model runs on."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue):
        self.loop, self.queue = loop, queue

    def send(self, response=None, flags=0):
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (response, flags))


class KServeTriton(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Serves every model at the root of `repository` (each a Python-backend model.py beside its config.pbtxt)."""

    def __init__(self, repository: Path):
        self.configs = {
            d.name: parse_config(d / "config.pbtxt")
            for d in sorted(Path(repository).iterdir())
            if (d / "config.pbtxt").is_file()
        }
        self.models = {name: initialize(Path(repository) / name, config) for name, config in self.configs.items()}
        self.server: grpc.aio.Server | None = None
        self.port = 0
        #: every request a model was handed, in order
        self.requests: list[Request] = []

    async def start(self) -> int:
        self.server = grpc.aio.server()
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return self.port

    async def stop(self) -> None:
        assert self.server is not None, "stop() before start()"
        await self.server.stop(grace=0)
        for model in self.models.values():
            model.finalize()

    async def ServerLive(self, request, context):
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return service_pb2.ServerReadyResponse(ready=True)

    async def RepositoryIndex(self, request, context):
        index = service_pb2.RepositoryIndexResponse.ModelIndex
        return service_pb2.RepositoryIndexResponse(
            models=[index(name=n, version="1", state="READY") for n in self.configs]
        )

    async def ModelConfig(self, request, context):
        if request.name not in self.configs:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Request for unknown model: '{request.name}'")
        return service_pb2.ModelConfigResponse(config=self.configs[request.name])

    def _config(self, name: str) -> ModelConfig:
        if name not in self.configs:
            raise Refused(grpc.StatusCode.NOT_FOUND, f"Request for unknown model: '{name}' is not found")
        return self.configs[name]

    async def ModelInfer(self, request, context):
        try:
            config = self._config(request.model_name)
            if config.model_transaction_policy.decoupled:
                raise Refused(
                    grpc.StatusCode.UNIMPLEMENTED,
                    "ModelInfer RPC doesn't support models with decoupled transaction policy",
                )
            (response,) = [r async for r in self._run(config, request, context)]
            if response.error_message:
                raise Refused(grpc.StatusCode.INTERNAL, response.error_message)
        except Refused as e:
            await context.abort(e.code, e.message)
        return response.infer_response

    async def ModelStreamInfer(self, request_iterator, context):
        async for request in request_iterator:
            try:
                config = self._config(request.model_name)
                async for response in self._run(config, request, context):
                    yield response
            except Refused as e:
                yield service_pb2.ModelStreamInferResponse(error_message=e.message)

    async def _run(self, config, request, context):
        """Hand one request to its model; yield each response until the final one."""
        inputs = check_request(config, request)
        queue: asyncio.Queue = asyncio.Queue()
        triton_request = Request(inputs, request.id, _Sender(asyncio.get_running_loop(), queue))
        self.requests.append(triton_request)
        context.add_done_callback(lambda _: triton_request.cancelled.set())  # the client went away
        self.models[config.name].execute([triton_request])
        empty_final = (
            "triton_enable_empty_final_response" in request.parameters
            and request.parameters["triton_enable_empty_final_response"].bool_param
        )
        while True:
            response, flags = await queue.get()
            final = bool(flags & FINAL)
            if response is None:
                if final and empty_final:
                    message = service_pb2.ModelInferResponse(model_name=config.name, id=request.id)
                    message.parameters["triton_final_response"].bool_param = True
                    yield service_pb2.ModelStreamInferResponse(infer_response=message)
            elif response.error is not None:
                yield service_pb2.ModelStreamInferResponse(error_message=response.error.message())
            else:
                message = to_kserve(config, request, response)
                message.parameters["triton_final_response"].bool_param = final
                yield service_pb2.ModelStreamInferResponse(infer_response=message)
            if final:
                return


@contextlib.contextmanager
def fakes_installed(mpi: FakeMPI | None = None):
    """The stand-in modules in sys.modules for the duration (what model.py imports in initialize)."""
    saved = {name: sys.modules.get(name) for name in fake_modules()}
    sys.modules.update(fake_modules(mpi))
    ScriptedLLM.instances.clear()
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
