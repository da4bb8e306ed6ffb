"""GET /v1/models — the models the admitted workers serve."""

from fastapi import APIRouter

from service.gateway.dependencies import DispatcherDep
from service.gateway.errors import responses

router = APIRouter()


@router.get("/v1/models", responses=responses(401))
async def list_models(dispatcher: DispatcherDep):
    return {
        "object": "list",
        "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "deepspec", "max_model_len": max_seq_len or None}
            for name, max_seq_len in sorted(dispatcher.pool.models().items())
        ],
    }
