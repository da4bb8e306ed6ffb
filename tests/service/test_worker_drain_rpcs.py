"""The worker's drain waits for its inference RPCs, not only for its scheduler (service/worker/server.py `drain`).

A request the scheduler has finished may still have responses to send; stopping the gRPC server then cancels the
call ("Cancelling all calls"), which the gateway reports as a failure mid-stream. `make e2e`'s rolling restart
caught it on loaded cores, where the half second of grace the server's stop gives was not enough."""

from __future__ import annotations

import asyncio

from service.worker.server import WorkerService
from service.worker.settings import WorkerSettings


async def _drain_with_an_rpc_open(rpc_done_after_s: float, drain_timeout_s: float) -> list[str]:
    """The order in which an RPC past its last engine step finishes sending and the drain stops the server."""
    worker = WorkerService(
        WorkerSettings(
            target="stub", host="127.0.0.1", port=0, metrics_port=-1, drain_timeout_s=drain_timeout_s, stub_step_ms=1
        )
    )
    await worker.start()
    events, stop = [], worker.stop

    async def recorded_stop():
        events.append("server stopped")
        await stop()

    async def finish_sending():
        await asyncio.sleep(rpc_done_after_s)
        events.append("rpc done")
        worker.active_rpcs -= 1

    worker.stop = recorded_stop
    worker.active_rpcs += 1  # the scheduler is idle; the RPC is still sending
    sender = asyncio.create_task(finish_sending())
    await worker.drain()
    await sender
    return events


def test_drain_waits_for_an_rpc_still_sending():
    assert asyncio.run(_drain_with_an_rpc_open(rpc_done_after_s=0.3, drain_timeout_s=30)) == [
        "rpc done",
        "server stopped",
    ]  # before: the server stopped at once, the scheduler being idle


def test_drain_still_ends_at_its_deadline():
    assert asyncio.run(_drain_with_an_rpc_open(rpc_done_after_s=2, drain_timeout_s=0.2)) == [
        "server stopped",
        "rpc done",
    ]
