"""The FastAPI app factory: ``create_app(engine, settings)``.

One router per API surface (routes/), errors in OpenAI's shape (errors.py),
request ids and body limits as pure ASGI middleware, bearer auth on ``/v1``,
bounded admission and a graceful shutdown that lets in-flight work finish.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi

from omnistage.config.settings import ServerSettings
from omnistage.server.deps import require_api_key
from omnistage.server.errors import error_responses, install_error_handlers
from omnistage.server.fleet import store_unavailable
from omnistage.server.jobs import StoreUnavailable
from omnistage.server.middleware import BodySizeLimit, JsonDepthLimit, RequestContext
from omnistage.server.options import ServeOptions
from omnistage.server.routes import (
    audio,
    audio_generate,
    chat,
    images,
    lora,
    moshi_chat,
    realtime,
    robot,
    system,
    transcriptions,
    videos,
)
from omnistage.server.state import ServerState
from omnistage.server.video_fleet import start_leases

logger = logging.getLogger("omnistage.server")


def create_app(
    engine: Any, settings: ServerSettings | None = None, options: ServeOptions | None = None, **option_fields: Any
) -> FastAPI:
    """``engine`` is an ``AsyncOmni`` (started by the app's lifespan if it is not yet)."""
    options = options or ServeOptions(**option_fields)
    state = ServerState(engine, settings or ServerSettings(), options)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await state.jobs.open()  # a store that cannot be reached: start-up fails naming it
        await state.storage.start()
        await _start_engine(app, engine)
        await start_leases(state).start()  # and take over jobs left by a front-end that died
        logger.info("serving %s (pipeline %s) as %r", engine.model, engine.pipeline.name, state.model_name)
        try:
            yield
        finally:
            await _shutdown(state)

    app = FastAPI(title="omnistage", description="OpenAI-compatible API for omni-modality pipelines", lifespan=lifespan)
    app.state.omni = state
    install_error_handlers(app)
    app.add_exception_handler(StoreUnavailable, store_unavailable)  # a 503 naming the store

    app.include_router(system.router)
    secured = [Depends(require_api_key)]
    # every /v1 route can answer these; routes add their own (413, 415, 409, ...)
    common = error_responses(400, 401, 404, 500, 503, 504)
    for module in (system.v1, chat.router, images.router, audio.router, transcriptions.router, videos.router):
        app.include_router(module, dependencies=secured, responses=common)
    app.include_router(audio_generate.router, dependencies=secured, responses=common)  # text -> sound
    app.include_router(realtime.router)  # a WebSocket: checks the API key itself (an error event + close code)
    app.include_router(robot.router)  # OpenPI's policy WebSocket: checks the API key itself (refused handshake)
    app.include_router(moshi_chat.router)  # moshi.server's /api/chat: checks the API key itself (refused handshake)
    if options.allow_runtime_lora_updating:  # as vLLM: without the flag these paths do not exist (404)
        app.include_router(lora.router, dependencies=secured, responses=common)
    app.openapi = lambda: _openapi(app)
    # Outermost first: ids wrap everything (413s get ids too); the size cap counts what the depth check reads.
    app.add_middleware(JsonDepthLimit)
    app.add_middleware(BodySizeLimit, max_bytes=options.max_body_bytes)
    app.add_middleware(RequestContext, metrics=state.metrics)
    return app


async def _start_engine(app: FastAPI, engine: Any) -> None:
    """Start the stages; ``app.state.cancel_start()`` (a stop signal during start-up, from any thread) stops
    that: the stages started so far are stopped, and start-up fails with a message saying why."""
    starting = asyncio.ensure_future(engine.start())
    loop, stopped = asyncio.get_running_loop(), []

    def cancel_start() -> None:
        stopped.append(True)
        loop.call_soon_threadsafe(starting.cancel)

    app.state.cancel_start = cancel_start
    try:
        await starting
    except asyncio.CancelledError:
        if not stopped:
            raise
        raise RuntimeError("stopped while the stages started (the stages started so far are stopped)") from None
    finally:
        app.state.cancel_start = None


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI documents a 422 for every route with a body; this server answers 400 instead (errors.py)."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                operation.get("responses", {}).pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(name, None)
        app.openapi_schema = schema
    return app.openapi_schema


async def _shutdown(state: ServerState) -> None:
    """Refuse new work, let in-flight requests and video jobs finish (bounded), then stop the engine. (The
    HTTP server drains the requests before it closes their connections: ``state.drain``, done once.)"""
    await state.drain.run()
    deadline = state.drain.begin()  # one grace for requests and video jobs together
    jobs = list(state.background)
    if jobs:
        _, pending = await asyncio.wait(jobs, timeout=max(0.0, deadline - asyncio.get_running_loop().time()))
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    if state.leases is not None:
        await state.leases.stop()  # (after the final writes of the jobs cancelled above)
    await state.storage.stop()
    await state.jobs.close()
    await state.engine.shutdown()
    logger.info("shutdown complete")
