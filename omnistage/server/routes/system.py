"""GET /, /health, /metrics (open) and /v1/models (behind the API key)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Depends
from fastapi.responses import FileResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from omnistage.server.app import get_state
from omnistage.server.errors import APIError
from omnistage.server.state import ServerState

router = APIRouter()
v1 = APIRouter(prefix="/v1")

PLAYGROUND = Path(__file__).resolve().parent.parent / "static" / "playground.html"


@router.get("/", include_in_schema=False)
async def root(state: ServerState = Depends(get_state)) -> Response:
    if PLAYGROUND.is_file():
        return FileResponse(PLAYGROUND, media_type="text/html")
    return JSONResponse({"name": "omnistage", "model": state.model_name, "docs": "/docs"})


@router.get("/health")
async def health(state: ServerState = Depends(get_state)) -> JSONResponse:
    stats = state.engine.stage_stats()
    stages = {str(sid): {"healthy": s.healthy, "queue_depth": s.queue_depth, "running": s.running,
                         **({"detail": s.detail} if s.detail else {})} for sid, s in stats.items()}
    ready = state.engine.is_ready and not state.admission.closing
    body = {"status": "ok" if ready else "unavailable", "model": state.model_name, "stages": stages,
            "in_flight": state.admission.pending}
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/metrics", include_in_schema=False)
async def metrics(state: ServerState = Depends(get_state)) -> Response:
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _model_card(state: ServerState) -> dict:
    engine = state.engine
    return {
        "id": state.model_name,
        "object": "model",
        "created": state.started_at,
        "owned_by": "omnistage",
        "root": engine.model,
        "pipeline": engine.pipeline.name,
        "output_modalities": engine.output_modalities.names(),
        "stages": [{"stage_id": s.stage_id, "kind": s.kind, "output": s.output, "final": s.final}
                   for s in engine.pipeline.stages],
    }


@v1.get("/models")
async def list_models(state: ServerState = Depends(get_state)) -> dict:
    return {"object": "list", "data": [_model_card(state)]}


@v1.get("/models/{model_id:path}")
async def retrieve_model(model_id: str, state: ServerState = Depends(get_state)) -> dict:
    if model_id != state.model_name:
        raise APIError(404, f"model {model_id!r} does not exist; this server serves {state.model_name!r}",
                       param="model", code="model_not_found")
    return _model_card(state)
