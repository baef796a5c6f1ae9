"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter, as ``vllm serve`` has them.

Mounted only with ``--allow-runtime-lora-updating`` (without it the paths do not exist: 404, as in
vLLM). Success is a 200 with a plain-text message; a missing or conflicting name, or an adapter the
stages cannot take (missing file, another base model, rank above ``--max-lora-rank``), is a 400
naming the field; unloading an unknown adapter is a 404. Unloading lets requests already running
with the adapter finish; later requests naming it get a 404.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict

from omnistage.errors import InvalidRequestError
from omnistage.server.deps import get_state
from omnistage.server.errors import APIError, bad_request
from omnistage.server.state import ServerState

router = APIRouter(prefix="/v1")
_TEXT = {
    200: {"description": "Success (a plain-text message)", "content": {"text/plain": {"schema": {"type": "string"}}}}
}


class LoadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str
    lora_path: str
    load_inplace: bool = False  # replace an adapter of that name (running requests keep the old one)


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str
    lora_int_id: int | None = None  # vLLM's field; names are what identify adapters here


@router.post("/load_lora_adapter", response_class=PlainTextResponse, responses=_TEXT)
async def load_lora_adapter(body: LoadLoRAAdapterRequest, state: ServerState = Depends(get_state)) -> PlainTextResponse:
    if not body.lora_name or not body.lora_path:
        raise bad_request(
            "Both 'lora_name' and 'lora_path' must be provided.", "lora_name" if not body.lora_name else "lora_path"
        )
    if state.is_base_model(body.lora_name):
        raise bad_request(f"The lora adapter '{body.lora_name}' conflicts with a served base model.", "lora_name")
    if state.loras.get(body.lora_name) is not None:
        if not body.load_inplace:
            raise bad_request(
                f"The lora adapter '{body.lora_name}' has already been loaded. If you want to load "
                "the adapter in place, set 'load_inplace' to True.",
                "lora_name",
            )
        await state.loras.unload(body.lora_name)
    try:
        await state.loras.load(body.lora_name, body.lora_path)
    except InvalidRequestError as e:
        raise APIError(400, e.message, param=e.field) from None
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@router.post("/unload_lora_adapter", response_class=PlainTextResponse, responses=_TEXT)
async def unload_lora_adapter(
    body: UnloadLoRAAdapterRequest, state: ServerState = Depends(get_state)
) -> PlainTextResponse:
    if not body.lora_name:
        raise bad_request("'lora_name' needs to be provided to unload a LoRA adapter.", "lora_name")
    try:
        await state.loras.unload(body.lora_name)
    except KeyError:
        raise APIError(
            404, f"The lora adapter '{body.lora_name}' cannot be found.", param="lora_name", code="model_not_found"
        ) from None
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
