"""GET /v1/realtime/robot/openpi (WebSocket): a robot policy served as OpenPI's policy server serves one, so
``openpi_client.websocket_client_policy.WebsocketClientPolicy`` (and the robot runtimes built on it) work unchanged.

On connect the server sends its metadata; then each binary frame is one observation and is answered with one
action chunk (wire.py: msgpack with NumPy arrays). An observation holds ``prompt`` (the task, in words) and the
camera frame ``observation/image`` (or ``image``): uint8 ``[H, W, 3]``. The request's settings (``action_domain``,
``action_chunk_size``, ``resolution_tier``, ``num_inference_steps``, ``seed``, any knob the model takes) come from
the URL's query and may be overridden per observation by keys of the same names. The answer: ``actions``
(float32 ``[steps, action width]``), ``action_domain``, ``action_fps`` and ``server_timing``. A malformed
observation is answered with a text frame naming the key at fault (what OpenPI's client raises as a server
error); the connection stays open for the next one. Served for models that make the ``action`` modality.
"""

from __future__ import annotations

import hmac
import time
from typing import Any

import numpy as np
from fastapi import APIRouter, WebSocket
from PIL import Image
from pydantic import ValidationError
from starlette.websockets import WebSocketDisconnect

from omnistage.errors import APIError, InvalidRequestError
from omnistage.modality import OutputModality
from omnistage.params import RequestKnobs, validation_error
from omnistage.server.errors import from_engine_error
from omnistage.server.robot.wire import WireError, pack, unpack
from omnistage.server.state import ServerState

router = APIRouter(prefix="/v1")

IMAGE_KEYS = ("observation/image", "image")
NOT_KNOBS = {"prompt", *IMAGE_KEYS, "model"}
POLICY_VIOLATION, UNSUPPORTED = 1008, 1003


class ObservationError(ValueError):
    """An observation the policy cannot take; the message names the key."""


def _authorized(ws: WebSocket, key: str | None) -> bool:
    """OpenPI's client sends ``Authorization: Api-Key KEY``; OpenAI-style ``Bearer KEY`` is taken too."""
    if not key:
        return True
    scheme, _, token = ws.headers.get("authorization", "").partition(" ")
    return scheme.lower() in ("api-key", "bearer") and hmac.compare_digest(token.strip().encode(), key.encode())


@router.websocket("/realtime/robot/openpi")
async def openpi(ws: WebSocket, model: str | None = None) -> None:
    state: ServerState = ws.app.state.omni
    if not _authorized(ws, state.options.api_key):
        await ws.close(POLICY_VIOLATION)  # before the handshake: the client sees HTTP 403
        return
    await ws.accept()
    refusal = _refusal(state, model)
    if refusal is not None:
        await ws.send_text(refusal)
        await ws.close(UNSUPPORTED)
        return
    settings = {k: v for k, v in ws.query_params.items() if k not in NOT_KNOBS}
    await ws.send_bytes(pack(_metadata(state, settings)))
    try:
        while True:
            frame = await ws.receive_bytes()
            try:
                answer = await _infer(state, unpack(frame), settings)
            except (ObservationError, WireError) as e:
                await ws.send_text(str(e))
            except InvalidRequestError as e:  # the key first, as the client reads it (not the stage that said it)
                await ws.send_text(f"{e.field}: {e.message}" if e.field else e.message)
            except APIError as e:
                await ws.send_text(e.message)
            except Exception as e:  # a failed request fails this observation only
                await ws.send_text(from_engine_error(e).message)
            else:
                await ws.send_bytes(pack(answer))
    except (WebSocketDisconnect, KeyError, RuntimeError):  # gone, or a text frame where an observation belongs
        return


def _refusal(state: ServerState, model: str | None) -> str | None:
    try:
        state.check_model(model)
    except APIError as e:
        return f"model: {e.message}"
    if OutputModality.ACTION not in state.engine.output_modalities:
        return f"model {state.model_name!r} makes no actions (it produces {state.engine.output_modalities})"
    return None


def _metadata(state: ServerState, settings: dict[str, str]) -> dict[str, Any]:
    return {
        "model": state.model_name,
        "protocol": "openpi",
        "observation_keys": {"prompt": "str", "observation/image": "uint8 [H, W, 3] (or 'image')"},
        "settings": settings,
    }


def _observation(obs: Any) -> tuple[str, Image.Image, dict[str, Any]]:
    if not isinstance(obs, dict):
        raise ObservationError(f"observation: expected a map of named values, got {type(obs).__name__}")
    prompt = obs.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise ObservationError("prompt: the task in words (a non-empty string) is required")
    key = next((k for k in IMAGE_KEYS if k in obs), None)
    if key is None:
        raise ObservationError(f"observation/image: a camera frame is required (one of {', '.join(IMAGE_KEYS)})")
    frame = obs[key]
    if not (isinstance(frame, np.ndarray) and frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[2] == 3):
        got = f"{frame.dtype} {list(frame.shape)}" if isinstance(frame, np.ndarray) else type(frame).__name__
        raise ObservationError(f"{key}: expected a uint8 [H, W, 3] array, got {got}")
    overrides = {k: v.item() if isinstance(v, np.generic) else v for k, v in obs.items() if k not in NOT_KNOBS}
    return prompt, Image.fromarray(frame), overrides


async def _infer(state: ServerState, obs: Any, settings: dict[str, str]) -> dict[str, Any]:
    t0 = time.perf_counter()
    prompt, image, overrides = _observation(obs)
    try:
        knobs = RequestKnobs.model_validate({"task": "policy", **settings, **overrides})
    except ValidationError as e:
        raise validation_error(e) from None
    req = state.engine.make_request(
        {"prompt": prompt, "multi_modal_data": {"image": [image]}}, knobs=knobs, warnings=[]
    )
    result = await state.run(None, req)
    if result.actions is None:
        raise ObservationError("the model made no actions for this observation")
    return {
        "actions": np.asarray(result.actions, dtype=np.float32),
        "action_domain": result.action_domain,
        "action_fps": result.action_fps,
        "server_timing": {"infer_ms": (time.perf_counter() - t0) * 1000.0},
    }
