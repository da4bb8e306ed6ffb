"""The gateway's admission queue (service/gateway/admission.py) and the service classes it ranks by: priority
between classes, token-weighted fair shares between keys, bounded waiting that sheds the lowest class first with a
reason, token budgets; then the whole path, a class sent to the worker and labelling its acceptance metrics."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from service.gateway.admission import AdmissionQueue, Shed, estimate_tokens
from service.gateway.service_classes import KeyPolicy, ServiceClasses, caller_id
from tests.service.conftest import Gateway, Worker, metric_value

INTERACTIVE = KeyPolicy(service_class="interactive")
BATCH = KeyPolicy(service_class="batch")


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _queue(limit: int | None = 1, **kwargs) -> AdmissionQueue:
    return AdmissionQueue(lambda: limit, poll_s=0.01, **kwargs)


async def _until(predicate) -> None:
    for _ in range(200):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("never happened")


def test_a_waiting_interactive_request_goes_before_batch_ones_that_came_first():
    async def main():
        queue, order = _queue(), []
        holder = queue.ticket("b", BATCH, 10)
        await queue.admit(holder)

        async def request(caller, policy):
            ticket = queue.ticket(caller, policy, 10)
            await queue.admit(ticket)
            order.append(caller)
            queue.release(ticket, 10)

        tasks = [asyncio.ensure_future(request(f"batch{i}", BATCH)) for i in range(3)]
        await _until(lambda: len(queue.waiting) == 3)
        tasks.append(asyncio.ensure_future(request("chat", INTERACTIVE)))
        await _until(lambda: len(queue.waiting) == 4)
        queue.release(holder, 10)
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(main())[0] == "chat"


def test_keys_of_one_class_share_the_tokens_by_their_weights():
    """Two batch keys with weights 1 and 3 keep 20 requests each waiting; one slot serves them one at a time, and
    the tokens each gets over the first 40 grants follow the weights (Virtual Token Counter)."""

    async def main():
        queue, served = _queue(), {"light": 0, "heavy": 0}
        policies = {
            "light": KeyPolicy(service_class="batch", weight=1),
            "heavy": KeyPolicy(service_class="batch", weight=3),
        }

        async def request(caller):
            ticket = queue.ticket(caller, policies[caller], 100)
            await queue.admit(ticket)
            served[caller] += 100
            await asyncio.sleep(0)
            queue.release(ticket, 100)

        holder = queue.ticket("other", BATCH, 1)
        await queue.admit(holder)
        tasks = [asyncio.ensure_future(request(c)) for _ in range(20) for c in ("light", "heavy")]
        await _until(lambda: len(queue.waiting) == 40)
        queue.release(holder, 1)
        while sum(served.values()) < 2000:
            await asyncio.sleep(0)
        share = served["heavy"] / sum(served.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return share

    assert asyncio.run(main()) == pytest.approx(0.75, abs=0.05)


def test_slots_kept_for_the_interactive_class_are_never_filled_by_batch_traffic():
    async def main():
        queue = AdmissionQueue(lambda: 2, reserve=lambda: 1, poll_s=0.01)
        for i in range(2):
            await queue.admit(queue.ticket(f"b{i}", BATCH, 1))
        late_batch = asyncio.ensure_future(queue.admit(queue.ticket("b2", BATCH, 1)))
        await _until(lambda: queue.waiting)
        await asyncio.wait_for(queue.admit(queue.ticket("chat", INTERACTIVE, 1)), 1)  # the reserved slot
        waiting = not late_batch.done()
        late_batch.cancel()
        await asyncio.gather(late_batch, return_exceptions=True)
        return waiting, queue.in_flight

    assert asyncio.run(main()) == (True, 3)


def test_a_full_queue_sheds_the_lowest_class_first_with_a_reason():
    async def main():
        queue = _queue(max_waiting=2)
        await queue.admit(queue.ticket("x", BATCH, 1))
        batch = [asyncio.ensure_future(queue.admit(queue.ticket(f"b{i}", BATCH, 1))) for i in range(2)]
        await _until(lambda: len(queue.waiting) == 2)
        chat = asyncio.ensure_future(queue.admit(queue.ticket("chat", INTERACTIVE, 1)))
        await _until(lambda: any(t.done() for t in batch))
        displaced = [t.exception() for t in batch if t.done()]
        with pytest.raises(Shed) as late:  # the queue holds one batch and one interactive: a batch ranks last
            await queue.admit(queue.ticket("b9", BATCH, 1))
        chat.cancel()
        for task in batch:
            task.cancel()
        await asyncio.gather(chat, *batch, return_exceptions=True)
        return displaced, late.value

    displaced, late = asyncio.run(main())
    assert [e.drop_reason if isinstance(e, Shed) else e for e in displaced] == ["displaced"]
    assert late.drop_reason == "queue_full"
    assert late.http_status == 429 and late.retry_after_s == 1


def test_a_request_that_waits_past_its_latency_objective_is_shed():
    async def main():
        clock = Clock()
        queue = _queue(clock=clock)
        await queue.admit(queue.ticket("x", BATCH, 1))
        waiter = asyncio.ensure_future(queue.admit(queue.ticket("chat", KeyPolicy(ttft_objective_s=2.0), 1)))
        await _until(lambda: queue.waiting)
        clock.now = 2.5
        with pytest.raises(Shed) as info:
            await waiter
        return info.value, queue

    error, queue = asyncio.run(main())
    assert error.drop_reason == "queue_timeout" and not queue.waiting and queue.active["chat"] == 0


def test_a_spent_token_budget_is_429_with_the_wait_until_enough_is_back():
    async def main():
        clock = Clock()
        queue = _queue(limit=None, clock=clock)
        policy = KeyPolicy(tokens_per_minute=600)
        first = queue.ticket("k", policy, 400)
        await queue.admit(first)
        queue.release(first, 500)  # the usage was more than the estimate: the budget is charged the difference
        with pytest.raises(Shed) as info:
            await queue.admit(queue.ticket("k", policy, 200))
        clock.now = 30.0  # half a minute refills 300 tokens: 100 + 300 >= 200
        await queue.admit(queue.ticket("k", policy, 200))
        return info.value

    error = asyncio.run(main())
    assert error.drop_reason == "token_budget" and error.retry_after_s == 10  # (200 - 100) tokens at 10 a second


def test_no_cap_admits_at_once_and_the_estimate_counts_choices():
    async def main():
        queue = _queue(limit=None)
        tickets = [queue.ticket(None, KeyPolicy(), 1) for _ in range(100)]
        for ticket in tickets:
            await queue.admit(ticket)
        return queue.in_flight

    assert asyncio.run(main()) == 100
    assert estimate_tokens(400, 16, 2) == 100 + 32 and estimate_tokens(0, None, 1) == 256


def test_service_classes_load_from_yaml_and_refuse_unknown_classes(tmp_path):
    path = tmp_path / "classes.yaml"
    path.write_text("default: {service_class: batch}\nkeys:\n  sk-a: {service_class: interactive, weight: 2}\n")
    classes = ServiceClasses.load(path)
    assert classes.policy(caller_id("sk-a")).service_class == "interactive"
    assert classes.policy(caller_id("sk-b")).service_class == classes.policy(None).service_class == "batch"
    assert classes.keys == {"sk-a"}
    with pytest.raises(ValueError, match=r"keys\.sk-a\.service_class.*interactive, standard, batch"):
        ServiceClasses.load(inline='{"keys": {"sk-a": {"service_class": "gold"}}}')


def test_the_gateway_digests_each_key_once_not_on_every_request(monkeypatch):
    """A key's caller identity (its digest) is worked out when the gateway starts; each request only compares."""
    import service.gateway.app as app
    from service.gateway.errors import AuthenticationError
    from service.gateway.settings import GatewaySettings

    state = app.GatewayState.build(
        GatewaySettings(workers="127.0.0.1:1", grpc_port=-1, api_keys="sk-a", service_classes='{"keys": {"sk-b": {}}}')
    )
    digests = []
    monkeypatch.setattr(app, "caller_id", lambda key: digests.append(key) or "digest")
    assert state.check_api_key("Bearer sk-b") == caller_id("sk-b")
    assert state.check_api_key("bearer  sk-a ") == caller_id("sk-a")
    with pytest.raises(AuthenticationError, match="incorrect API key"):
        state.check_api_key("Bearer sk-c")
    assert digests == []


def test_each_keys_class_reaches_the_worker_and_labels_its_acceptance_metrics(tmp_path):
    classes = '{"keys": {"sk-chat": {"service_class": "interactive"}, "sk-bulk": {"service_class": "batch"}}}'
    worker = Worker(tmp_path, "--stub-step-ms", "1").start()
    gw = Gateway(tmp_path, worker.address, env={"DEEPSPEC_GATEWAY_SERVICE_CLASSES": classes}).start()
    try:
        worker.wait_ready()
        gw.wait_ready()
        for key in ("sk-chat", "sk-bulk"):
            response = httpx.post(
                f"{gw.url}/v1/completions",
                headers={"authorization": f"Bearer {key}"},
                json={"prompt": "Hello", "max_tokens": 24, "temperature": 0},
            )
            assert response.status_code == 200, response.text
        assert httpx.post(f"{gw.url}/v1/completions", json={"prompt": "x"}).status_code == 401  # keys are keys
        text = worker.metrics()
        for service_class in ("interactive", "batch"):
            assert metric_value(text, "deepspec:spec_decode_num_draft_tokens_total", **{"class": service_class}) > 0
        assert metric_value(text, "deepspec:spec_decode_num_draft_tokens_total", **{"class": "standard"}) == 0
    finally:
        gw.terminate()
        worker.terminate()
