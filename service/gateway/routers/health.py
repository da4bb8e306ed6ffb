"""Probes and metrics, open without an API key: /health/live, /health/ready, /metrics."""

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from service.gateway.dependencies import DispatcherDep
from service.metrics import exposition

router = APIRouter()


@router.get("/health/live")
async def live():
    return {"status": "ok"}


@router.get("/health/ready")
async def ready(dispatcher: DispatcherDep):
    """200 while at least one worker is admitted and the gateway is not draining."""
    if dispatcher.ready:
        return {"status": "ready", "workers": sum(e.healthy for e in dispatcher.pool.endpoints.values())}
    reason = "draining" if dispatcher.draining else "no ready worker"
    return JSONResponse({"status": "not ready", "reason": reason}, status_code=503)


@router.get("/metrics")
async def metrics(request: Request):
    body, content_type = exposition(request.app.state.gateway.metrics.registry)
    return Response(body, headers={"Content-Type": content_type})
