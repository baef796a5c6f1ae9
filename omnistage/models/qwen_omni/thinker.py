"""The thinker stage: the generic vLLM llm stage on the Qwen3-Omni folder (vLLM's own
``Qwen3OmniMoeThinkerForConditionalGeneration``: text, audio, images and video in), plus what the
talker needs of a media prompt.

- A plain text ``prompt`` (no ``multi_modal_data``) is a user message: Qwen3-Omni is a chat model, and the talker
  speaks the assistant turn of a chat (it finds it by ``<|im_start|>assistant``).
  System messages reach the thinker only (transformers' talker skips system turns).
- Sampling defaults are the checkpoint's ``generation_config.json`` (under the request's own values).
- dtype: the checkpoint's own unless the deploy names one. vLLM's CPU backend would run a float32 checkpoint
  in bfloat16 (its preferred CPU dtype), which is why an image prompt once agreed with transformers' float32
  ``generate`` for 2 tokens only: the thinker must compute what the reference computes.
- Outputs text and the reply's token ids (what the talker reads), and the rendered prompt's ids in the
  first output (the generic stage does that for every llm stage). When the talker runs, an output that is not the
  last says so (``reply_continues``): its tokens will be fed back to the thinker, so the talker may read them at
  once instead of waiting for the next token (transformers' talker never sees the thinker's last token).
- **Media for the talker** (speaking pipeline only, and only when the talker runs for this request): transformers'
  talker reads, at the prompt's media positions, the thinker's hidden state after layer ``accept_hidden_layer``,
  and gives the prompt M-RoPE positions from the media's grids. The thinker engine itself hands that state out:
  it runs ``vllm_speaking.py`` (vLLM's own thinker that also writes it into a cache-only layer) with the KV
  connector of ``stages/llm/hidden_connector.py``; a media request names a file in its ``SamplingParams``
  (``rendered``), the connector writes the prompt's rows there before the first token leaves the engine, and the
  first output carries ``talker_media``: those rows ``[media tokens, D]`` and the grids (``image_grid_thw``,
  ``video_grid_thw``, ``video_second_per_grid``, ``audio_feature_lengths``, ``use_audio_in_video``) read off the
  rendered input. No second engine, no second prefill. vLLM's multimodal processor cache is off on this stage
  (``checkpoint_deploy``), so repeated media are processed again, as transformers does for every call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Any

from omnistage.models.qwen_omni.config import load_omni_config
from omnistage.models.qwen_omni.vllm_plugin import SPEAKING_ARCHITECTURE
from omnistage.pipeline import StageContext
from omnistage.stages.base import StageOutput, StageRequest
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
        if isinstance(req.params, Mapping):  # the checkpoint's generation config under the request's values
            req = replace(req, params={**self.defaults, **req.params})
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


class ThinkerEngine(OmniThinkerEngine):
    def __init__(self, ctx: StageContext, feeds_talker: bool = False):
        config = load_omni_config(ctx.model) if ctx.model else None
        super().__init__(ctx, config.sampling_defaults("thinker") if config else {}, feeds_talker and bool(config))
        self.media_ids = config.media_token_ids if config else frozenset()

    def rendered(self, req: StageRequest, engine_input: Any, params: Any) -> None:
        ids = engine_input["prompt_token_ids"]
        if self.rows_dir is None or not req.consumers or not any(t in self.media_ids for t in ids):
            return
        self.ask_rows(req, engine_input, params, reply=False)

    def _talker_media(self, request_id: str, ids: list[int]) -> dict[str, Any]:
        import torch

        grids = self.take_grids(request_id)
        rows = self.rows(request_id, len(ids))
        self.done_with_rows(request_id)
        mask = torch.isin(torch.as_tensor(ids), torch.tensor(sorted(self.media_ids)))
        return {"hidden": rows[mask].contiguous(), **grids}

    async def generate(self, req: StageRequest) -> AsyncIterator[StageOutput]:
        rid = req.request_id
        try:
            async for out in super().generate(req):
                if self.asked_rows(rid):  # the first output: the connector wrote the prompt's rows before it
                    out.data["talker_media"] = self._talker_media(rid, out.data["prompt_token_ids"])
                if req.consumers and not out.finished and out.data.get("token_ids"):
                    out.data["reply_continues"] = True  # more tokens follow: these are fed back (module docstring)
                yield out
        finally:
            self.forget_rows(rid)


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


def build_thinker_engine(ctx: StageContext, feeds_talker: bool = False) -> ThinkerEngine:
    dtype = load_omni_config(ctx.model).dtype if ctx.model else None
    ctx = checkpoint_deploy(ctx, dtype, feeds_talker)
    if feeds_talker and ctx.model:
        ctx = speaking_deploy(ctx, SPEAKING_ARCHITECTURE)
    return ThinkerEngine(ctx, feeds_talker=feeds_talker)
