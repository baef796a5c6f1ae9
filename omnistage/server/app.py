"""The FastAPI app factory: ``create_app(engine, settings)``.

One router per API surface (routes/), errors in OpenAI's shape (errors.py),
request ids and body limits as pure ASGI middleware, bearer auth on ``/v1``,
bounded admission and a graceful shutdown that lets in-flight work finish.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request

from omnistage.config.settings import ServerSettings
from omnistage.server.errors import APIError, install_error_handlers
from omnistage.server.middleware import BodySizeLimit, RequestContext
from omnistage.server.state import ServeOptions, ServerState

logger = logging.getLogger("omnistage.server")


def get_state(request: Request) -> ServerState:
    return request.app.state.omni


def require_api_key(request: Request) -> None:
    key = request.app.state.omni.options.api_key
    if not key:
        return
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise APIError(401, "missing or wrong API key (send 'Authorization: Bearer <key>')", code="invalid_api_key",
                       headers={"WWW-Authenticate": "Bearer"})


def create_app(engine: Any, settings: ServerSettings | None = None, options: ServeOptions | None = None,
               **option_fields: Any) -> FastAPI:
    """``engine`` is an ``AsyncOmni`` (started by the app's lifespan if it is not yet)."""
    options = options or ServeOptions(**option_fields)
    state = ServerState(engine, settings or ServerSettings(), options)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await state.storage.start()
        await engine.start()
        logger.info("serving %s (pipeline %s) as %r", engine.model, engine.pipeline.name, state.model_name)
        try:
            yield
        finally:
            await _shutdown(state)

    app = FastAPI(title="omnistage", description="OpenAI-compatible API for omni-modality pipelines",
                  lifespan=lifespan)
    app.state.omni = state
    install_error_handlers(app)

    from omnistage.server.routes import audio, chat, images, system, videos

    app.include_router(system.router)
    secured = [Depends(require_api_key)]
    for module in (system.v1, chat.router, images.router, audio.router, videos.router):
        app.include_router(module, dependencies=secured)
    # Outermost first: ids wrap everything (413s get ids too).
    app.add_middleware(BodySizeLimit, max_bytes=options.max_body_bytes)
    app.add_middleware(RequestContext, metrics=state.metrics)
    return app


async def _shutdown(state: ServerState) -> None:
    """Refuse new work, let in-flight requests and video jobs finish (bounded), then stop the engine."""
    state.admission.closing = True
    grace = state.options.shutdown_grace_s
    if not await state.admission.wait_idle(grace):
        logger.warning("shutdown: %d request(s) still running after %.0fs; aborting them", state.admission.pending, grace)
    jobs = list(state.background)
    if jobs:
        _, pending = await asyncio.wait(jobs, timeout=grace)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    await state.storage.stop()
    await state.engine.shutdown()
    logger.info("shutdown complete")
