"""GET /, /static/*, /health, /metrics (open) and /v1/models (behind the API key)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import FileResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from omnistage.modality import OutputModality
from omnistage.params import RequestKnobs, denoising_stages
from omnistage.server.deps import get_state
from omnistage.server.errors import APIError
from omnistage.server.image_sizes import image_sizes
from omnistage.server.state import DEFAULT_MODEL, ServerState

router = APIRouter()
v1 = APIRouter(prefix="/v1")

STATIC = Path(__file__).resolve().parent.parent / "static"
PLAYGROUND = STATIC / "playground.html"
# The playground's own files, by name: a fixed table, so no request path ever reaches the file system.
ASSETS = {
    "playground.js": "text/javascript",
    "playground.css": "text/css",
    "playground-talk.js": "text/javascript",
    "talk-worklet.js": "text/javascript",
}


@router.get("/", include_in_schema=False)
async def root(state: ServerState = Depends(get_state)) -> Response:
    if PLAYGROUND.is_file():
        return FileResponse(PLAYGROUND, media_type="text/html", headers={"Cache-Control": "no-cache"})
    return JSONResponse({"name": "omnistage", "model": state.model_name, "docs": "/docs"})


@router.get("/static/{name}", include_in_schema=False)
async def asset(name: str) -> Response:
    if name not in ASSETS or not (STATIC / name).is_file():
        raise APIError(404, f"no static file {name!r}", param="name", code="not_found")
    return FileResponse(STATIC / name, media_type=ASSETS[name], headers={"Cache-Control": "no-cache"})


@router.get(
    "/health",
    responses={
        503: {
            "description": "A stage is down (restarting) or the server is "
            "shutting down; the same body, status unavailable"
        }
    },
)
async def health(state: ServerState = Depends(get_state)) -> JSONResponse:
    stats = state.engine.stage_stats()
    stages = {
        str(sid): {
            "healthy": s.healthy,
            "queue_depth": s.queue_depth,
            "running": s.running,
            **({"detail": s.detail} if s.detail else {}),
        }
        for sid, s in stats.items()
    }
    ready = state.engine.is_ready and not state.admission.closing
    body = {
        "status": "ok" if ready else "unavailable",
        "model": state.model_name,
        "stages": stages,
        "in_flight": state.admission.pending,
    }
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/metrics", include_in_schema=False)
async def metrics(state: ServerState = Depends(get_state)) -> Response:
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


# Route names a model card lists, and the output each needs (None: any pipeline).
# Route name -> what a model needs to be served by it: "chat" (PipelineInfo.chat), "speech" (a declared
# PipelineInfo.speech and audio out), "generate_audio" (a final diffusion stage whose output is audio alone: a
# text-to-audio model, which is no speech model), "image_edits" (images out and PipelineInfo.image_edits), or an
# output modality the model produces.
ROUTES: tuple[tuple[str, OutputModality | str], ...] = (
    ("chat", "chat"),
    ("images.generations", OutputModality.IMAGE),
    ("images.edits", "image_edits"),
    ("audio.speech", "speech"),
    ("audio.generate", "generate_audio"),
    ("videos", OutputModality.VIDEO),
)
_JSON_SCALARS = (bool, int, float, str)


def _routes(state: ServerState) -> list[str]:
    """The routes that serve this model, by what its pipeline declares. Chat is generic (text in, any output)
    unless the pipeline declares ``PipelineInfo(chat=False)`` (e.g. a speech LM that speaks a plain prompt)."""
    produced = state.engine.output_modalities
    info = state.engine.pipeline.info
    has = {
        "chat": info.chat,
        "speech": info.speech is not None and OutputModality.AUDIO in produced,
        "image_edits": info.image_edits and OutputModality.IMAGE in produced,
        "generate_audio": any(
            s.kind == "diffusion" and s.final and OutputModality.parse(_stage_output(state, s)) == OutputModality.AUDIO
            for s in state.engine.pipeline.stages
        ),
    }
    return [name for name, needs in ROUTES if (has[needs] if isinstance(needs, str) else needs in produced)]


def _defaults(state: ServerState) -> dict[str, Any]:
    """The standard knobs the deploy defaults set (what a client gets when it sends none): diffusion knobs
    from the stages that denoise, vLLM knobs from the llm stages; ``size`` when width and height are both set."""
    engine = state.engine
    per_stage = engine.default_sampling_params_list
    out: dict[str, Any] = {}
    sources = [(sid, RequestKnobs.DIFFUSION) for sid in denoising_stages(engine.pipeline)]
    sources += [(s.stage_id, RequestKnobs.LLM) for s in engine.pipeline.stages if s.knobs == "llm"]
    for sid, keys in sources:  # the first stage that sets a knob gives its value
        for key in keys:
            value = per_stage[sid].get(key)
            if key not in out and isinstance(value, _JSON_SCALARS):
                out[key] = value
    if isinstance(out.get("width"), int) and isinstance(out.get("height"), int):
        out["size"] = f"{out['width']}x{out['height']}"
    return out


def _stage_output(state: ServerState, stage: Any) -> str:
    deploy = state.engine.deploy.stage(stage.stage_id)
    return (deploy.engine_output_type if deploy else None) or stage.output


def _model_card(state: ServerState, name: str | None = None) -> dict:
    """What a client (the playground) needs to offer the right forms: outputs, stages, routes, defaults,
    for image models the sizes they draw, for speech models the voices. ``name``: which served name (default the
    first)."""
    engine = state.engine
    info = engine.pipeline.info
    card = {
        "id": name or state.model_name,
        "object": "model",
        "created": state.started_at,
        "owned_by": "omnistage",
        "root": engine.model,
        "pipeline": engine.pipeline.name,
        "description": engine.pipeline.description,
        "output_modalities": engine.output_modalities.names(),
        "stages": [
            {
                "stage_id": s.stage_id,
                "name": s.name,
                "kind": s.kind,
                "output": _stage_output(state, s),
                "final": s.final,
                "inputs": [e.source for e in s.inputs],
            }
            for s in engine.pipeline.stages
        ],
        "routes": _routes(state),
        "defaults": _defaults(state),
    }
    if OutputModality.IMAGE in engine.output_modalities:
        sizes = image_sizes(info, engine.model, card["defaults"], state.limits.max_image_pixels)
        if sizes:
            card["image_sizes"] = sizes
    # a model that draws only what its training captions named (the demo): its words, and prompts that work
    if info.vocabulary:
        card["vocabulary"] = {kind: list(words) for kind, words in info.vocabulary.items()}
    if info.example_prompts:
        card["example_prompts"] = list(info.example_prompts)
    if info.speech is not None and OutputModality.AUDIO in engine.output_modalities:  # a speech model
        speech = info.speech
        card["voices"] = list(speech.voices)
        if speech.default_voice:
            card["default_voice"] = speech.default_voice
        if speech.sample_rate:
            card["sample_rate"] = speech.sample_rate
    return card


def _lora_card(state: ServerState, module: Any) -> dict:
    """A LoRA adapter as vLLM lists one: its path as ``root``, the base model as ``parent``; the routes it
    serves are the base model's."""
    base = (
        module.base_model_name
        if module.base_model_name and state.is_base_model(module.base_model_name)
        else state.model_name
    )
    return {
        "id": module.name,
        "object": "model",
        "created": state.started_at,
        "owned_by": "omnistage",
        "root": module.path,
        "parent": base,
        "pipeline": state.engine.pipeline.name,
        "routes": _routes(state),
    }


@v1.get("/models")
async def list_models(state: ServerState = Depends(get_state)) -> dict:
    cards = [_model_card(state, name) for name in state.model_names]  # each served name, as vLLM lists them
    return {"object": "list", "data": cards + [_lora_card(state, m) for m in state.loras.modules()]}


@v1.get("/models/{model_id:path}")
async def retrieve_model(model_id: str, state: ServerState = Depends(get_state)) -> dict:
    module = state.loras.get(model_id)
    if module is not None:
        return _lora_card(state, module)
    if model_id == DEFAULT_MODEL and DEFAULT_MODEL not in state.model_names:  # the one base model, by its own name
        return _model_card(state, state.model_name)
    if model_id not in state.model_names:
        raise APIError(
            404,
            f"model {model_id!r} does not exist; this server serves {', '.join(map(repr, state.model_names))}",
            param="model",
            code="model_not_found",
        )
    return _model_card(state, model_id)
