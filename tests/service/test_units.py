"""In-memory units: tensor round trips, P2C routing, the scheduler over the real engine and the stub target, the CLI's
help."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import cast, get_args

import numpy as np
import pytest
import tritonclient.grpc as triton

from deepspec.decoding import RequestError, RequestErrorCode, SpecEngine
from deepspec.decoding.params import SamplingParams
from deepspec_protocol import tensors
from deepspec_protocol import worker as p
from service.gateway.routing import Endpoint, WorkerPool
from service.gateway.worker_client import GenerationRequest, WorkerClient, build_infer_request, parse_response
from service.kserve_messages import service_pb2
from service.metrics import GatewayMetrics, WorkerMetrics
from service.worker.scheduler import QueueFullError, Scheduler, class_priority
from service.worker.stub_target import STUB_TEXT, StubDrafter, StubTarget
from tests.service.conftest import output, picked


def test_gateway_request_reads_back_in_the_worker():
    req = GenerationRequest(
        "r1", "m", prompt="héllo", max_tokens=7, temperature=0.5, top_k=3, seed=2**63, stop=["a", "bc"]
    )
    values = tensors.read_inputs(build_infer_request(req))
    assert tensors.scalar(values, p.TEXT_INPUT, str) == "héllo"
    assert tensors.scalar(values, p.MAX_TOKENS, int) == 7
    assert tensors.scalar(values, p.TEMPERATURE, float) == 0.5
    assert tensors.scalar(values, p.SEED, int) == 2**63
    assert tensors.strings(values, p.STOP_WORDS) == ["a", "bc"]
    assert tensors.scalar(values, p.STREAM, bool) is True


def test_tritonclient_typed_contents_are_read_too():
    """A client that fills `contents` instead of raw bytes (e.g. KServe's reference clients)."""
    request = service_pb2.ModelInferRequest()
    t = request.inputs.add(name=p.MAX_TOKENS, datatype="INT32", shape=[1, 1])
    t.contents.int_contents.append(9)
    assert tensors.scalar(tensors.read_inputs(request), p.MAX_TOKENS, int) == 9


def test_worker_response_parses_in_the_gateway_and_in_tritonclient():
    response = service_pb2.ModelInferResponse(model_name="m", id="x")
    tensors.add_output(response, p.TEXT_OUTPUT, "ab€")
    tensors.add_output(response, p.EXTRA_NUM_OUTPUT_TOKENS, 3)
    tensors.add_output(response, p.EXTRA_FINISH_REASON, "stop")
    tensors.set_bool_param(response, p.FINAL_RESPONSE_PARAM, True)
    chunk = parse_response(response)
    assert (chunk.text, chunk.stats.num_output_tokens, chunk.finish_reason, chunk.final) == ("ab€", 3, "stop", True)
    result = triton.InferResult(response)
    assert output(result, p.TEXT_OUTPUT)[0][0].decode() == "ab€"
    assert output(result, p.EXTRA_NUM_OUTPUT_TOKENS).dtype == np.int32


def test_gateway_reads_a_response_with_typed_contents():
    """A stock Triton may answer in the typed `contents` fields, without DeepSpec's extra outputs."""
    response = service_pb2.ModelInferResponse(model_name="m", id="x")
    out = response.outputs.add(name=p.TEXT_OUTPUT, datatype="BYTES", shape=[1, 1])
    out.contents.bytes_contents.append("déjà".encode())
    out = response.outputs.add(name=p.NUM_DRAFT_TOKENS, datatype="INT32", shape=[1, 1])
    out.contents.int_contents.append(4)
    chunk = parse_response(response)
    stats = chunk.stats
    assert (chunk.text, stats.num_draft_tokens, stats.num_output_tokens, chunk.finish_reason) == ("déjà", 4, 0, None)


def test_one_codec_encodes_every_datatype_the_protocol_uses():
    request = service_pb2.ModelInferRequest()
    for name, datatype, values in [
        ("s", "BYTES", ["a", "€"]),
        ("i", "INT32", [-5]),
        ("b", "BOOL", [True]),
        ("f", "FP32", [0.25]),
        ("u", "UINT64", [2**64 - 1]),
    ]:
        tensors.add_input(request, name, datatype, values)
    values = tensors.read_inputs(request)
    assert tensors.strings(values, "s") == ["a", "€"]
    assert [tensors.scalar(values, n, k) for n, k in [("i", int), ("b", bool), ("f", float), ("u", int)]] == [
        -5,
        True,
        0.25,
        2**64 - 1,
    ]
    assert [list(t.shape) for t in request.inputs] == [[1, 2], [1, 1], [1, 1], [1, 1], [1, 1]]


def test_truncated_bytes_tensor_is_a_clear_error():
    with pytest.raises(tensors.TensorError, match="truncated"):
        tensors.deserialize_bytes(b"\x05\x00\x00\x00ab")


def test_stream_error_prefix_round_trip():
    assert p.decode_stream_error(p.encode_stream_error("RESOURCE_EXHAUSTED", "busy: x")) == (
        "RESOURCE_EXHAUSTED",
        "busy: x",
    )
    assert p.decode_stream_error("some Triton error") == ("INTERNAL", "some Triton error")


def _pool(outstanding: list[int]) -> WorkerPool:
    pool = WorkerPool("", GatewayMetrics(), rng=random.Random(0))
    for i, n in enumerate(outstanding):
        # no client: picking never calls a worker
        pool.endpoints[f"w{i}"] = Endpoint(
            f"w{i}", client=cast(WorkerClient, None), outstanding=n, healthy=True, models={"m": 2048}
        )
    return pool


def test_p2c_never_picks_the_busier_of_its_two_samples():
    """With loads 0 and 100 the idle worker always wins; with three workers the busiest is never chosen."""
    assert {picked(_pool([0, 100]), "m") for _ in range(50)} == {"w0"}
    pool = _pool([0, 5, 100])
    picks = [picked(pool, "m") for _ in range(300)]
    assert "w2" not in picks and picks.count("w0") > picks.count("w1")


def test_pick_skips_ejected_tried_and_other_models():
    pool = _pool([0, 0, 0])
    pool.endpoints["w0"].healthy = False
    pool.endpoints["w1"].models = {"other": 0}
    assert picked(pool, "m") == "w2"
    assert pool.pick("m", exclude={"w2"}) is None
    assert pool.models() == {"m": 2048, "other": 0}


async def _collect(scheduler: Scheduler, prompt: list[int], params: SamplingParams):
    return [out async for out in scheduler.generate(prompt, params)]


def test_scheduler_batches_requests_that_join_and_leave():
    async def main():
        engine = SpecEngine(StubTarget(), StubDrafter(), max_batch_size=2, num_speculative_tokens=3)
        metrics = WorkerMetrics("stub")
        scheduler = Scheduler(engine, metrics, max_queue=8)
        scheduler.start().wait()
        try:
            results = await asyncio.gather(
                *(_collect(scheduler, [1, 2], SamplingParams(max_tokens=n)) for n in (5, 30, 12))
            )
        finally:
            scheduler.stop()
        for outputs, n in zip(results, (5, 30, 12)):
            out, stats, _ = outputs[-1]
            assert out.finished and stats.num_output_tokens == n and stats.num_prompt_tokens == 2
            assert "".join(o.new_text for o, _, _ in outputs) == STUB_TEXT[:n]
            assert stats.num_draft_tokens > 0 and 0 < stats.num_accepted_tokens < stats.num_draft_tokens
        assert metrics.request_success.labels("stub", "length")._value.get() == 3
        assert metrics.num_requests_running.labels("stub")._value.get() == 0

    asyncio.run(main())


def test_scheduler_runs_n_sequences_on_one_prefill_and_counts_the_prompt_once():
    async def main():
        engine = SpecEngine(StubTarget(), StubDrafter(), max_batch_size=4, num_speculative_tokens=3)
        metrics = WorkerMetrics("stub")
        scheduler = Scheduler(engine, metrics, max_queue=8)
        scheduler.start().wait()
        try:
            outputs = [
                o
                async for o in scheduler.generate([1, 2, 3], SamplingParams(max_tokens=9, temperature=1.0, seed=5), n=3)
            ]
            with pytest.raises(ValueError, match="do not fit"):
                await anext(scheduler.generate([1], SamplingParams(max_tokens=3), n=5))
        finally:
            scheduler.stop()
        last = {index: stats for out, stats, index in outputs if out.finished}
        assert sorted(last) == [0, 1, 2] and all(s.num_output_tokens == 9 for s in last.values())
        assert engine.prompt_tokens_computed == 3  # the prompt once (no warm-up here)
        assert metrics.prompt_tokens.labels("stub")._value.get() == 3
        assert metrics.request_success.labels("stub", "length")._value.get() == 3

    asyncio.run(main())


def test_scheduler_queue_bound_and_abort():
    async def main():
        engine = SpecEngine(StubTarget(step_delay_s=0.005), None, max_batch_size=1)
        scheduler = Scheduler(engine, WorkerMetrics("stub"), max_queue=1)
        scheduler.start().wait()
        try:
            first = scheduler.generate([1], SamplingParams(max_tokens=1000))
            await anext(first)  # running
            second = asyncio.ensure_future(_collect(scheduler, [1], SamplingParams(max_tokens=3)))  # waiting
            await asyncio.sleep(0.05)
            with pytest.raises(QueueFullError):
                await anext(scheduler.generate([1], SamplingParams(max_tokens=3)))
            assert isinstance(first, AsyncGenerator)
            await first.aclose()  # abort frees the slot: the waiting one runs
            outputs = await asyncio.wait_for(second, 5)
            assert outputs[-1][1].num_output_tokens == 3
            assert engine.num_running == 0
        finally:
            scheduler.stop()

    asyncio.run(main())


def test_the_queue_lets_an_interactive_request_pass_waiting_batch_requests():
    """Service classes reach the engine as priorities (interactive first): a request of the interactive class that
    arrives behind queued batch requests runs before them, and the batch ones keep their order."""
    assert class_priority("interactive") < class_priority("standard") < class_priority("batch")
    assert class_priority("unknown") == class_priority("standard")

    async def main():
        engine = SpecEngine(StubTarget(step_delay_s=0.002), None, max_batch_size=1)
        scheduler = Scheduler(engine, WorkerMetrics("stub"), max_queue=8)
        scheduler.start().wait()
        order: list[str] = []

        async def run(name: str, service_class: str) -> None:
            async for _ in scheduler.generate([1], SamplingParams(max_tokens=3), service_class=service_class):
                pass
            order.append(name)

        try:
            first = scheduler.generate([1], SamplingParams(max_tokens=1000))
            await anext(first)  # holds the only slot
            tasks = []
            for name, service_class in (("batch-1", "batch"), ("batch-2", "batch"), ("interactive", "interactive")):
                tasks.append(asyncio.ensure_future(run(name, service_class)))
                await asyncio.sleep(0.02)  # queued in this order
            assert isinstance(first, AsyncGenerator)
            await first.aclose()
            await asyncio.wait_for(asyncio.gather(*tasks), 10)
        finally:
            scheduler.stop()
        assert order == ["interactive", "batch-1", "batch-2"]

    asyncio.run(main())


def test_cli_help_is_instant_and_names_units():
    out = subprocess.run(
        [sys.executable, "-m", "service", "worker", "--help"], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0 and "--max-queue" in out.stdout and "seconds" in out.stdout
    out = subprocess.run(
        [sys.executable, "-m", "service", "gateway", "--workers", "nonsense"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2 and "host:port" in out.stderr


def test_worker_passes_its_weight_settings_to_the_target_loader(monkeypatch):
    import deepspec.models.target_loader
    from service.worker.engine import load_engine
    from service.worker.settings import WorkerSettings

    seen = {}

    def fake_load_target(spec, **kwargs):
        seen.update(kwargs, spec=spec)
        raise RuntimeError("stop here")

    monkeypatch.setattr(deepspec.models.target_loader, "load_target", fake_load_target)
    with pytest.raises(RuntimeError, match="stop here"):
        load_engine(WorkerSettings(target="smollm2-135m", dtype="bfloat16", quantization="gguf"))
    assert seen == {
        "spec": "smollm2-135m",
        "dtype": "bfloat16",
        "device": "cpu",
        "quantization": "gguf",
        "chat_template": None,
        "max_seq_len": None,
        "for_chat": False,
    }
    assert WorkerSettings().quantization == "auto"
    with pytest.raises(ValueError, match="quantization"):
        WorkerSettings(quantization="int8")


def test_worker_and_gateway_settings_live_apart():
    """The worker's defaults are the library's own (no copies); the gateway's settings need no library at all, and
    the fields both have come from one base."""
    from deepspec.models.aliases import DEFAULT_TARGET
    from deepspec.models.quantization import WEIGHT_FORMATS
    from service.gateway.settings import GatewaySettings
    from service.settings import ServiceSettings
    from service.worker.settings import WorkerSettings

    assert WorkerSettings().target == DEFAULT_TARGET
    assert get_args(WorkerSettings.model_fields["quantization"].annotation) == WEIGHT_FORMATS
    assert issubclass(WorkerSettings, ServiceSettings) and issubclass(GatewaySettings, ServiceSettings)
    for cls in (WorkerSettings, GatewaySettings):  # declared once, in the base
        assert not set(ServiceSettings.model_fields) & set(cls.__annotations__), cls
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            _NO_DEEPSPEC + "import service.gateway.settings, service.cli\n"
            "service.cli.build_parser(('gateway',)).parse_args(['gateway', '--workers', 'w:1'])",
        ],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-2000:]


#: blocks the deepspec library, as in the gateway image
_NO_DEEPSPEC = """import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "deepspec":
            raise ImportError("no deepspec in the gateway image: " + name)
sys.meta_path.insert(0, Block())
"""


def test_the_engines_error_code_travels_structured_to_the_openai_body():
    """Worker side: the status map attaches the engine's code; gateway side: the client reads it back from the stream
    parameter and the dispatcher puts it in the error body, whatever the message says."""
    from deepspec.decoding.validation import RequestError as EngineRequestError
    from service.gateway.dispatch import _to_service_error
    from service.gateway.worker_client import WorkerError, _stream_error_code
    from service.worker.server import _status_of

    status, message, code = _status_of(EngineRequestError(RequestErrorCode.CONTEXT_TOO_LONG, "no words to match"))
    assert (status.name, message, code) == ("INVALID_ARGUMENT", "no words to match", "context_length_exceeded")
    assert _status_of(ValueError("messages must be a non-empty list"))[2] is None
    response = service_pb2.ModelInferResponse()
    assert _stream_error_code(response) is None  # a stock Triton sends no code
    response.parameters[p.ERROR_CODE_PARAM].string_param = code
    assert _stream_error_code(response) == "context_length_exceeded"
    error = _to_service_error(WorkerError("INVALID_ARGUMENT", "no words to match", code), started=False)
    assert error.http_status == 400 and error.body()["error"]["code"] == "context_length_exceeded"
    # the message alone decides nothing: "context length" in a message without a code is no code
    assert _to_service_error(WorkerError("INVALID_ARGUMENT", "context length"), started=False).code is None
    with pytest.raises(RequestError) as info:
        SamplingParams(max_tokens=0)
    assert info.value.code is RequestErrorCode.MAX_TOKENS_INVALID


def test_worker_response_stats_round_trip_through_the_protocol():
    from deepspec.decoding.params import StepOutput
    from service.worker.server import _response

    stats = p.RequestStats(
        num_prompt_tokens=5, num_output_tokens=9, num_draft_tokens=14, num_accepted_tokens=6, num_spec_steps=3
    )
    request = service_pb2.ModelInferRequest(model_name="m", id="r")
    chunk = parse_response(_response(request, "abc", StepOutput("r", [1], "abc", True, "length"), stats, 0, True))
    assert chunk.stats == stats and chunk.stats.acceptance_length == 3.0 and chunk.finish_reason == "length"


def test_scored_token_tables_round_trip_through_the_protocol():
    """deepspec_protocol/token_scores.py: rows of one table, a token without a logprob (the prompt's first: NaN on the
    wire, a padding row among the alternatives) and none at all (no tensors, read back as None)."""
    from deepspec_protocol.token_scores import TokenScore, add_scores, read_scores

    scores = [
        TokenScore("é", 7, None),
        TokenScore("", 8, -0.5, ("a", "\ufffd"), (1, 2), (-0.25, -1.5)),
        TokenScore("b", 9, -3.0, ("c", "d"), (3, 4), (-0.5, -2.0)),
    ]
    response = service_pb2.ModelInferResponse()
    add_scores(response, p.PROMPT_SCORES, scores)
    add_scores(response, p.OUTPUT_SCORES, [TokenScore("x", 1, -2.0)])
    values = tensors.read_outputs(response)
    assert read_scores(response, values, p.PROMPT_SCORES) == scores
    assert read_scores(response, values, p.OUTPUT_SCORES) == [TokenScore("x", 1, -2.0)]
    assert read_scores(service_pb2.ModelInferResponse(), {}, p.OUTPUT_SCORES) is None
    del values[p.PROMPT_SCORES.token_ids]
    with pytest.raises(tensors.TensorError, match="different lengths"):
        read_scores(response, values, p.PROMPT_SCORES)


def _stub_outputs(prompt: bytes, **params) -> list:
    engine = SpecEngine(StubTarget(), StubDrafter(), max_batch_size=1, num_speculative_tokens=3)
    outputs = []
    engine.generate([list(prompt)], SamplingParams(logprobs=1, **params), on_output=outputs.append)
    return outputs


def test_each_response_carries_the_scores_of_the_tokens_its_text_completes():
    """service/worker/token_texts.py over the real engine: text held back as the possible start of a stop string
    brings its tokens' scores along when it is released; the stop string's own tokens come last."""
    from service.worker.token_texts import OutputScores

    target = StubTarget()
    scores = OutputScores(target.decode, lambda t: chr(t))
    outputs = _stub_outputs(b"x", max_tokens=40, stop=("lazy",))
    released = [scores.step(out) for out in outputs]
    assert "".join(out.new_text for out in outputs) == "The quick brown fox jumps over the "
    for out, chunk in zip(outputs[:-1], released[:-1]):
        assert "".join(s.token for s in chunk) == out.new_text
    assert "".join(s.token for s in released[-1]) == outputs[-1].new_text + "lazy"
    assert [s.token_id for chunk in released for s in chunk] == [t for out in outputs for t in out.new_token_ids]
    assert any(not out.new_text and out.new_token_ids for out in outputs)  # "l", "la", "laz" were held back


def test_the_stop_token_that_ends_a_request_is_scored_last_without_text():
    """lm-eval asks for one token past the prompt and drops the last entry: an EOS (here a stop id) that ends the
    request at once must still be that entry (deepspec StepOutput.stop_logprob)."""
    from service.worker.token_texts import OutputScores

    outputs = _stub_outputs(b"The ", max_tokens=1, stop_token_ids=(ord("q"),))  # the stub continues "The " with "q"
    (out,) = outputs
    assert out.new_token_ids == [] and out.finish_reason == "stop" and out.stop_logprob.token_id == ord("q")
    (score,) = OutputScores(StubTarget().decode, chr).step(out)
    assert (score.token, score.token_id, score.logprob) == ("", ord("q"), 0.0)


def test_prompt_texts_split_characters_as_the_output_does_and_concatenate_to_the_decoded_prompt():
    from deepspec.decoding.logprobs import TokenLogprob
    from service.worker.token_texts import prompt_scores

    target = StubTarget()
    ids = target.encode("hé €") + [0xE2, 0x82]  # ends inside a character, as a token-id prompt may
    no_logprobs: list[TokenLogprob | None] = [None] * len(ids)
    scores = prompt_scores(ids, no_logprobs, target.decode, chr)
    assert [s.token for s in scores] == ["h", "", "é", " ", "", "", "€", "", "\ufffd"]
    assert "".join(s.token for s in scores) == target.decode(ids)


def test_openai_logprob_shapes():
    """service/gateway/logprobs.py: the legacy dict keeps the likelier of two tokens with one text and always has the
    chosen token; JSON has no -Infinity (vLLM's floor); the chat shape's bytes are each token's UTF-8."""
    from deepspec_protocol.token_scores import TokenScore
    from service.gateway.logprobs import LOGPROB_FLOOR, chat_logprobs, completion_logprobs, concat

    scores = [
        TokenScore("é", 5, None),
        TokenScore("x", 6, -2.0, ("\ufffd", "\ufffd"), (1, 2), (-0.5, -1.0)),
        TokenScore("y", 7, float("-inf"), ("z",), (3,), (-0.1,)),
    ]
    shape = completion_logprobs(scores, start=10)
    assert shape == {
        "tokens": ["é", "x", "y"],
        "token_logprobs": [None, -2.0, LOGPROB_FLOOR],
        "top_logprobs": [None, {"\ufffd": -0.5, "x": -2.0}, {"z": -0.1, "y": LOGPROB_FLOOR}],
        "text_offset": [10, 11, 12],
    }
    assert concat(shape, completion_logprobs([])) == shape
    content = chat_logprobs(scores[1:2])["content"]
    assert content == [
        {
            "token": "x",
            "logprob": -2.0,
            "bytes": [120],
            "top_logprobs": [
                {"token": "\ufffd", "logprob": -0.5, "bytes": [239, 191, 189]},
                {"token": "\ufffd", "logprob": -1.0, "bytes": [239, 191, 189]},
            ],
        }
    ]


async def _first(chunks: AsyncIterator):
    return await anext(chunks)


def test_a_worker_that_cannot_forward_logprobs_is_not_sent_them():
    """An OpenAI-HTTP worker's client (gateway/openai_client.py) declares no `extensions`: a request that needs one
    is a 400 naming it, never a completion without it."""
    from service.gateway.dispatch import Dispatcher
    from service.gateway.errors import BadRequestError

    pool = _pool([0])
    pool.endpoints["w0"].client = cast(WorkerClient, object())  # a client that declares no extensions
    dispatcher = Dispatcher(pool, GatewayMetrics())
    for req, named in [
        (GenerationRequest("r1", "m", prompt="x", logprobs=0), "logprobs"),
        (GenerationRequest("r2", "m", prompt_token_ids=[1, 2]), "token-id prompts"),
    ]:
        with pytest.raises(BadRequestError, match=f"{named} are not supported by this worker"):
            asyncio.run(_first(dispatcher.generate(req, "completions")))
