"""The thinker stage both Qwen-Omni families run: vLLM's own thinker as the generic llm stage, plus what the talker needs of a prompt (its rows of hidden states, its media grids)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from omnistage.llm_params import LLMSamplingParams
from omnistage.pipeline import StageContext
from omnistage.stages.base import StageRequest
from omnistage.stages.llm.engine import LLMStageEngine, Prepared
from omnistage.stages.llm.hidden import CONNECTOR, PATH_KEY, REPLY_KEY, read_rows

logger = logging.getLogger(__name__)

_SHM = "/dev/shm"  # the rows' files: memory, not disk, where there is one


def checkpoint_deploy(ctx: StageContext, dtype: str | None, feeds_talker: bool) -> StageContext:
    """The deploy with the checkpoint's ``dtype`` unless it names one (see the module docstring), and, feeding the
    talker, without vLLM's multimodal processor cache: it leaves a media item it has processed before out of the
    engine input (its engine core caches it), and the media grids are read off that input."""
    deploy = ctx.deploy
    if deploy.dtype is None and "dtype" not in deploy.engine_args and dtype is not None:
        deploy = deploy.model_copy(update={"dtype": dtype})
    if feeds_talker and "mm_processor_cache_gb" not in deploy.engine_args:
        deploy = deploy.model_copy(update={"engine_args": {**deploy.engine_args, "mm_processor_cache_gb": 0}})
    return replace(ctx, deploy=deploy)


def media_grids(engine_input: Mapping[str, Any]) -> dict[str, Any]:
    """What transformers' ``get_rope_index`` takes of the media, from vLLM's processed items (prompt order)."""
    import torch

    items = engine_input.get("mm_kwargs") or {}

    def values(modality: str, key: str) -> list[Any]:
        return [item[key].data for item in items.get(modality, []) if key in item]

    def stacked(modality: str, key: str) -> Any:
        found = values(modality, key)
        return torch.stack([torch.as_tensor(v) for v in found]) if found else None

    in_video = values("video", "use_audio_in_video")
    return {
        "image_grid_thw": stacked("image", "image_grid_thw"),
        "video_grid_thw": stacked("video", "video_grid_thw"),
        "video_second_per_grid": stacked("video", "second_per_grid_ts"),
        "audio_feature_lengths": stacked("audio", "audio_feature_lengths"),
        "use_audio_in_video": bool(in_video and bool(in_video[0])),
    }


class OmniThinkerEngine(LLMStageEngine):
    """What the Qwen-Omni thinkers share: the checkpoint's sampling defaults under the request's, a plain prompt as
    a user message, and (feeding the talker) a directory for the files the engine's hidden-state connector writes
    (``stages/llm/hidden.py``), one per request that asks (``ask_rows``, which also keeps the request's media grids),
    removed with the stage."""

    def __init__(self, ctx: StageContext, defaults: dict[str, Any], feeds_talker: bool):
        super().__init__(ctx)
        self.defaults = defaults
        self.rows_dir = (
            tempfile.mkdtemp(prefix="omnistage-thinker-rows-", dir=_SHM if os.path.isdir(_SHM) else None)
            if feeds_talker
            else None
        )
        self._rows: dict[str, str] = {}  # request id -> its rows' file
        self._grids: dict[str, dict[str, Any]] = {}  # request id -> its media grids, until taken
        self.rows_read = 0  # requests whose rows went to the talker

    def ask_rows(self, req: StageRequest, engine_input: Any, params: Any, reply: bool) -> None:
        """Ask the engine for this request's hidden states (the prompt's; with ``reply`` also the reply's), and keep
        the media grids of its rendered input for the talker (``take_grids``)."""
        path = os.path.join(self.rows_dir, f"{uuid.uuid4().hex}.rows")
        asked = {PATH_KEY: path, **({REPLY_KEY: True} if reply else {})}
        params.extra_args = {**(params.extra_args or {}), "kv_transfer_params": asked}
        self._rows[req.request_id] = path
        self._grids[req.request_id] = media_grids(engine_input)

    def take_grids(self, request_id: str) -> dict[str, Any] | None:
        """The request's media grids the first time they are asked for, then None."""
        return self._grids.pop(request_id, None)

    def asked_rows(self, request_id: str) -> bool:
        return request_id in self._rows

    def rows(self, request_id: str, stop: int, start: int = 0) -> Any:
        """Rows ``[start, stop)`` of the hidden states the engine wrote for this request so far ([n, D] float32)."""
        return read_rows(self._rows[request_id], stop, start)

    def done_with_rows(self, request_id: str) -> None:
        """Every row the request needs was read: its file removed."""
        _remove(self._rows.pop(request_id))
        self.rows_read += 1

    def forget_rows(self, request_id: str) -> None:
        """The request ended (its rows taken or not): its file removed now, and again a second later in case a step
        already running was writing its first rows (later steps find no file and write nothing)."""
        self._grids.pop(request_id, None)
        path = self._rows.pop(request_id, None)
        if path is not None:
            _remove(path)
            asyncio.get_running_loop().call_later(1.0, _remove, path)

    async def shutdown(self) -> None:
        await super().shutdown()
        if self.rows_dir is not None:
            shutil.rmtree(self.rows_dir, ignore_errors=True)

    def prepare(self, req: StageRequest) -> Prepared:
        # the checkpoint's generation config under the request's values (a caller's own SamplingParams: as it is)
        if isinstance(req.params, (Mapping, LLMSamplingParams)):
            req = replace(req, params=LLMSamplingParams.from_any(req.params).under(self.defaults))
        inputs = req.inputs
        if (
            isinstance(inputs.get("prompt"), str)
            and inputs.get("messages") is None
            and inputs.get("prompt_token_ids") is None
            and not inputs.get("multi_modal_data")
        ):
            chat = {k: v for k, v in inputs.items() if k != "prompt"}
            chat["messages"] = [{"role": "user", "content": inputs["prompt"]}]
            req = replace(req, inputs=chat)
        return super().prepare(req)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


def speaking_deploy(ctx: StageContext, architecture: str) -> StageContext:
    """The deploy running the family's speaking thinker ``architecture`` (its other ``hf_overrides`` kept) with the
    connector that hands its hidden states out, unless it names its own architecture or ``kv_transfer_config``."""
    args = ctx.deploy.engine_args
    overrides = {"architectures": [architecture], **(args.get("hf_overrides") or {})}
    extra = {"hf_overrides": overrides, "kv_transfer_config": args.get("kv_transfer_config") or CONNECTOR}
    return replace(ctx, deploy=ctx.deploy.model_copy(update={"engine_args": {**args, **extra}}))
