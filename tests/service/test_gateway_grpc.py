"""The generated grpcio client (deepspec_protocol/protos) against the gateway's gRPC API; reflection; health."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from deepspec_protocol.protos.deepspec.v1 import completions_pb2 as pb
from deepspec_protocol.protos.deepspec.v1 import completions_pb2_grpc as pb_grpc
from service.worker.stub_target import STUB_TEXT
from tests.service.conftest import Gateway, Worker, metric_value

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def channel(gateway):
    # no wait for the channel: once /health/ready answers (what the fixture waits for), gRPC listens too
    with grpc.insecure_channel(f"127.0.0.1:{gateway.grpc_port}") as ch:
        yield ch


def test_complete(channel):
    response = pb_grpc.CompletionsStub(channel).Complete(pb.CompletionRequest(prompt="Hello", max_tokens=20))
    assert response.text == STUB_TEXT[:20] and response.finish_reason == "length" and response.model == "stub"
    assert (response.usage.prompt_tokens, response.usage.completion_tokens, response.usage.total_tokens) == (5, 20, 25)
    assert response.usage.num_accepted_tokens <= response.usage.num_draft_tokens


def test_complete_stream_with_messages(channel):
    request = pb.CompletionRequest(messages=[pb.ChatMessage(role="user", content="Hi")], max_tokens=30)
    chunks = list(pb_grpc.CompletionsStub(channel).CompleteStream(request))
    assert len(chunks) > 3 and "".join(c.text for c in chunks) == STUB_TEXT[:30]
    assert chunks[-1].finish_reason == "length" and chunks[-1].usage.completion_tokens == 30
    assert chunks[-1].usage.prompt_tokens == len("<|user|>Hi\n<|assistant|>")


def test_errors_map_to_status_codes(channel):
    stub = pb_grpc.CompletionsStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        stub.Complete(pb.CompletionRequest(prompt="x", max_tokens=100_000))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "context length" in (info.value.details() or "")
    with pytest.raises(grpc.RpcError) as info:
        stub.Complete(pb.CompletionRequest(prompt="x", model="nope"))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as info:
        stub.Complete(pb.CompletionRequest())
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_reflection_lists_the_service(channel):
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    # types-grpcio declares the stub's methods Incomplete; grpcio generates them callable
    responses = stub.ServerReflectionInfo(iter([request]))  # pyright: ignore[reportCallIssue]
    names = {s.name for r in responses for s in r.list_services_response.service}
    assert {"deepspec.v1.Completions", "grpc.health.v1.Health"} <= names


def test_health_is_serving(channel):
    stub = health_pb2_grpc.HealthStub(channel)
    for service in ("", "deepspec.v1.Completions"):
        request = health_pb2.HealthCheckRequest(service=service)
        # types-grpcio's HealthStub declares no methods; grpcio generates Check
        assert stub.Check(request).status == health_pb2.HealthCheckResponse.SERVING  # pyright: ignore[reportAttributeAccessIssue]


def test_cancel_and_abort_free_the_worker_slot(tmp_path):
    """Closing a gRPC stream or calling Abort cancels the worker's sequence."""
    worker = Worker(tmp_path, "--stub-step-ms", "20", "--max-batch-size", "2").start().wait_ready()
    gw = Gateway(tmp_path, worker.address).start().wait_ready()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}") as ch:
            stub = pb_grpc.CompletionsStub(ch)
            call = stub.CompleteStream(pb.CompletionRequest(prompt="Hi", max_tokens=1500))
            next(call)
            unary = stub.Complete.future(pb.CompletionRequest(prompt="Hi", max_tokens=1500))  # whole, then cancelled
            deadline = time.monotonic() + 30  # polls: returns as soon as it holds
            while metric_value(worker.metrics(), "deepspec:num_requests_running") < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            unary.cancel()
            victim_errors = []

            def victim():
                try:
                    list(stub.CompleteStream(pb.CompletionRequest(request_id="victim", prompt="Hi", max_tokens=1500)))
                except grpc.RpcError as e:
                    victim_errors.append(e)

            thread = threading.Thread(target=victim)
            thread.start()
            deadline = time.monotonic() + 30
            while metric_value(worker.metrics(), "deepspec:num_requests_running") < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert metric_value(worker.metrics(), "deepspec:num_requests_running") == 2
            call.cancel()
            assert stub.Abort(pb.AbortRequest(request_id="victim")).found
            thread.join(30)
            victim_error = victim_errors[0]
            assert victim_error.code() == grpc.StatusCode.CANCELLED and "aborted" in (victim_error.details() or "")
            assert not stub.Abort(pb.AbortRequest(request_id="victim")).found
            deadline = time.monotonic() + 30
            while metric_value(worker.metrics(), "deepspec:num_requests_running") and time.monotonic() < deadline:
                time.sleep(0.05)
            assert metric_value(worker.metrics(), "deepspec:num_requests_running") == 0
            assert metric_value(worker.metrics(), "deepspec:request_success_total", status="abort") == 3
    finally:
        gw.terminate()
        worker.terminate()


def test_taken_grpc_port_exits_non_zero_with_the_reason(stub_worker, tmp_path):
    """A port clash is a start-up failure with a message, not a gateway that serves HTTP and silently lacks gRPC."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        gw = Gateway(tmp_path, stub_worker.address)
        gw.args[gw.args.index("--grpc-port") + 1] = str(taken.getsockname()[1])
        gw.start()
        assert gw.process.wait(60) == 1
    gw.terminate()
    assert "cannot bind the gateway's gRPC port" in gw.log()


# The same inputs through both APIs: HTTP's 400 message is gRPC's INVALID_ARGUMENT details, word for word.
SAME_LIMITS = [
    ("NaN temperature", {"temperature": float("nan")}),
    ("infinite temperature", {"temperature": float("inf")}),
    ("1e30 temperature", {"temperature": 1e30}),
    ("top_p 0", {"top_p": 0.0}),
    ("top_p above 1", {"top_p": 1.5}),
    ("max_tokens 0", {"max_tokens": 0}),
    ("top_k beyond int32", {"top_k": 2**31}),
    ("100,000 stop strings", {"stop": ["a"] * 100_000}),
    ("a 3 MB stop string", {"stop": ["s" * 3_000_000]}),
    ("an empty stop string", {"stop": [""]}),
]


@pytest.mark.parametrize("fields", [c[1] for c in SAME_LIMITS], ids=[c[0] for c in SAME_LIMITS])
def test_grpc_refuses_what_http_refuses_with_the_same_message(channel, gateway, fields):
    import json

    import httpx

    response = httpx.post(
        f"{gateway.url}/v1/completions",
        content=json.dumps({"prompt": "x", **fields}),
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 400, response.text
    with pytest.raises(grpc.RpcError) as info:
        pb_grpc.CompletionsStub(channel).Complete(pb.CompletionRequest(prompt="x", **fields), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == response.json()["error"]["message"]


def test_grpc_refuses_bad_request_ids_roles_and_text(channel):
    stub = pb_grpc.CompletionsStub(channel)
    for request, words in [
        (pb.CompletionRequest(prompt="x", request_id="r" * 1_000_000), "request_id"),
        (pb.CompletionRequest(prompt="x", request_id="has space"), "request_id"),
        (pb.CompletionRequest(messages=[pb.ChatMessage(role="tool", content="x")]), "messages.0.role"),
        (pb.CompletionRequest(prompt="x", messages=[pb.ChatMessage(role="user", content="x")]), "exactly one"),
        (pb.CompletionRequest(prompt="x" * (2048 * 128 + 1)), "characters"),
    ]:
        with pytest.raises(grpc.RpcError) as info:
            stub.Complete(request, timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in (info.value.details() or ""), words


def test_a_malformed_protobuf_is_invalid_argument(channel):
    for method in ("Complete", "CompleteStream", "Abort"):
        path = f"/deepspec.v1.Completions/{method}"
        call = channel.unary_stream(path) if method == "CompleteStream" else channel.unary_unary(path)
        with pytest.raises(grpc.RpcError) as info:
            result = call(b"\x0a\xff\xff\xff", timeout=10)  # field 1, a length running past the end
            list(result) if method == "CompleteStream" else None
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
        assert "not a valid deepspec.v1" in (info.value.details() or "")
    assert pb_grpc.CompletionsStub(channel).Complete(pb.CompletionRequest(prompt="ok", max_tokens=2)).text == "Th"


def test_abort_needs_a_key_and_reaches_only_the_callers_own_requests(tmp_path):
    worker = Worker(tmp_path, "--stub-step-ms", "50").start().wait_ready()
    gw = Gateway(tmp_path, worker.address, env={"DEEPSPEC_API_KEYS": "key-a,key-b"}).start().wait_ready()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{gw.grpc_port}") as ch:
            stub = pb_grpc.CompletionsStub(ch)

            def as_(key):
                return (("authorization", f"Bearer {key}"),)

            for metadata in ((), as_("wrong")):
                with pytest.raises(grpc.RpcError) as info:
                    stub.Abort(pb.AbortRequest(request_id="r1"), metadata=metadata)
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            long = pb.CompletionRequest(request_id="r1", prompt="Hi", max_tokens=2000)
            a = stub.CompleteStream(long, metadata=as_("key-a"))
            next(a)
            # request ids are per caller: b may use "r1" too, and b's Abort does not reach a's "r1"
            b = stub.CompleteStream(long, metadata=as_("key-b"))
            next(b)
            assert stub.Abort(pb.AbortRequest(request_id="r1"), metadata=as_("key-b")).found
            with pytest.raises(grpc.RpcError) as info:
                list(b)
            assert info.value.code() == grpc.StatusCode.CANCELLED
            assert not stub.Abort(pb.AbortRequest(request_id="r1"), metadata=as_("key-b")).found
            assert next(a).text  # a's request still runs
            assert stub.Abort(pb.AbortRequest(request_id="r1"), metadata=as_("key-a")).found
            with pytest.raises(grpc.RpcError):
                list(a)
    finally:
        gw.terminate()
        worker.terminate()
    assert "Traceback" not in gw.log()
