"""Probes and metrics, open without an API key: /health/live, /health/ready, /metrics."""

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from service.gateway.dependencies import DispatcherDep
from service.metrics import exposition

router = APIRouter()


@router.get("/health/live")
async def live():
    return {"status": "ok"}


@router.get(
    "/health/ready",
    responses={503: {"description": "not ready: no worker admitted, or draining", "content": {"application/json": {}}}},
)
async def ready(request: Request, dispatcher: DispatcherDep):
    """200 while at least one worker is admitted and the gateway is not draining; with `ready_without_workers`
    200 until draining, so clients get 503 + Retry-After from every gateway instead of no gateway at all."""
    workers = sum(e.healthy for e in dispatcher.pool.endpoints.values())
    if dispatcher.ready or (not dispatcher.draining and request.app.state.gateway.settings.ready_without_workers):
        return {"status": "ready", "workers": workers}
    reason = "draining" if dispatcher.draining else "no ready worker"
    return JSONResponse({"status": "not ready", "reason": reason}, status_code=503)


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={  # Prometheus' text format
        404: {"description": "served on --metrics-port instead", "content": {"application/json": {}}}
    },
)
async def metrics(request: Request):
    if request.app.state.gateway.settings.metrics_port >= 0:  # served on its own port, never next to the API
        return JSONResponse({"detail": "Not Found"}, status_code=404)
    body, content_type = exposition(request.app.state.gateway.metrics.registry)
    return Response(body, headers={"Content-Type": content_type})
