"""Session memory through the service: the gateway sends a worker the session-memory key only for callers whose
policy opts in (service/gateway/service_classes.py), built from the caller's digest so two keys never share one
session's memory, and the worker hands it to the engine as SamplingParams.session."""

from __future__ import annotations

from service.gateway.service_classes import KeyPolicy, ServiceClasses, caller_id, memory_session
from service.gateway.signature import DEEPSPEC_WORKER, build_request
from service.gateway.worker_client import GenerationRequest


def test_only_an_opted_in_policy_with_a_session_gets_a_memory_key():
    on, off = KeyPolicy(session_memory=True), KeyPolicy()
    assert memory_session("abc", "s1", off) is None
    assert memory_session("abc", None, on) is None
    assert memory_session("abc", "s1", on) == "abc:s1"
    assert memory_session(None, "s1", on) == "anonymous:s1"  # auth off: one tenant


def test_two_keys_with_the_same_session_id_get_different_memory_keys():
    classes = ServiceClasses.load(inline="keys: {sk-a: {session_memory: true}, sk-b: {session_memory: true}}")
    a, b = caller_id("sk-a"), caller_id("sk-b")
    assert memory_session(a, "s1", classes.policy(a)) != memory_session(b, "s1", classes.policy(b))
    assert classes.policy(caller_id("sk-unlisted")).session_memory is False  # opt-in per key


def test_the_worker_request_carries_the_key_only_when_set():
    def inputs(**fields):
        request = build_request(GenerationRequest("r", "m", prompt="p", **fields), True, DEEPSPEC_WORKER)
        return {i.name: i for i in request.inputs}

    assert "session" not in inputs(session="s1")  # affinity alone: nothing remembered
    assert "session" in inputs(session="s1", memory_session="abc:s1")
