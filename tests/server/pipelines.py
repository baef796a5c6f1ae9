"""Small test pipelines for the HTTP server, built from real stage engines.

- ``WordEngine``: an ``llm``-kind stage engine that streams its reply word by
  word (a real StageEngine: deltas, finish reasons, aborts, token counts).
- ``ToneAdapter``: a generation adapter turning each streamed text chunk into
  audio (async chunk through the orchestrator's streaming edge).
- ``ImageAdapter`` / ``VideoAdapter``: generation adapters running a seeded
  torch conv over noise at the requested size / frame count.

Prompts starting with ``block:`` wait for ``GATE`` (admission / disconnect
tests); ``crash:`` makes the adapter raise (a genuine stage fault); so does the word ``tone-crash``
reaching ``ToneAdapter`` (a fault after a stream has started).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import zlib
from typing import Any

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.info import PipelineInfo, SpeechInfo
from omnistage.llm_params import LLMSamplingParams
from omnistage.pipeline import Edge, Pipeline, StageContext, StageSpec
from omnistage.stages.base import StageMetrics, StageOutput, StageRequest, StageStats

GATE = threading.Event()  # set -> blocked requests proceed
SAMPLE_RATE = 16000


def prompt_text(inputs: dict[str, Any]) -> str:
    if inputs.get("prompt") is not None:
        return inputs["prompt"]
    for m in reversed(inputs.get("messages") or []):
        if m["role"] == "user":
            c = m["content"]
            return c if isinstance(c, str) else " ".join(p["text"] for p in c if p["type"] == "text")
    return ""


def _wait_gate_sync(text: str) -> None:
    if text.startswith("block:"):
        GATE.wait(60)


class WordEngine:
    """Replies ``"echo <prompt words>"`` one word per step; honours max_tokens."""

    def __init__(self, ctx: StageContext):
        self.stage_id = ctx.spec.stage_id
        self._aborted: set[str] = set()
        self._running: set[str] = set()

    async def start(self) -> None:
        pass

    async def generate(self, req: StageRequest):
        text = prompt_text(req.inputs)
        params = LLMSamplingParams.from_any(req.params)
        if params.get("temperature", 0) > 5:
            raise InvalidRequestError("temperature", "must be at most 5 for this model")
        words = ["echo"] + text.split()
        n = min(len(words), int(params.get("max_tokens", 64)))
        self._running.add(req.request_id)
        try:
            for i, w in enumerate(words[:n]):
                if i == 1 and text.startswith("block:"):  # the first word is out: the request is streaming
                    while not GATE.is_set() and req.request_id not in self._aborted:
                        await asyncio.sleep(0.01)
                if req.request_id in self._aborted:
                    yield StageOutput(req.request_id, self.stage_id, {}, finished=True, finish_reason="abort")
                    return
                await asyncio.sleep(0.001)
                yield StageOutput(
                    req.request_id,
                    self.stage_id,
                    {"text": (" " if i else "") + w, "token_ids": [zlib.crc32(w.encode()) % 1000]},
                    False,
                )
            reason = "length" if n < len(words) else "stop"
            yield StageOutput(
                req.request_id,
                self.stage_id,
                {"prompt_token_ids": list(range(len(text.split()) + 3))},
                finished=True,
                metrics=StageMetrics(num_tokens=n),
                finish_reason=reason,
            )
        finally:
            self._running.discard(req.request_id)
            self._aborted.discard(req.request_id)

    async def feed(self, request_id: str, chunk: dict, last: bool) -> None:
        raise ValueError("WordEngine takes no streamed input")

    async def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)

    async def shutdown(self) -> None:
        pass

    def stats(self) -> StageStats:
        return StageStats(queue_depth=0, running=len(self._running))


class ToneAdapter:
    """Each text chunk -> 0.05 s of a tone per word (pitch from the word)."""

    def __init__(self, ctx: StageContext):
        pass

    def run(self, items):
        out = []
        for item in items:
            words = (item.inputs.get("text") or "").split()
            if "tone-crash" in words:  # a stage fault mid-stream: the words before it were already spoken
                raise RuntimeError("simulated stage fault mid-stream")
            t = torch.arange(int(0.05 * SAMPLE_RATE)) / SAMPLE_RATE
            parts = [0.3 * torch.sin(2 * torch.pi * (200 + zlib.crc32(w.encode()) % 600) * t) for w in words]
            out.append({"audio": torch.cat(parts).float(), "sample_rate": SAMPLE_RATE} if parts else {})
        return out


def text_chunk(delta: dict, request: Any, state: dict) -> dict | None:
    return {"text": delta["text"]} if delta.get("text") else None


class _ConvImages:
    """A seeded 1x1 conv over seeded noise: real torch work, deterministic per seed."""

    def __init__(self):
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1), torch.nn.Tanh(), torch.nn.Conv2d(8, 3, 1)).eval()

    @torch.no_grad()
    def render(self, h: int, w: int, seed: int, count: int, ref: Any = None) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(count, 3, h, w, generator=g)
        if ref is not None:  # edits: start from the (resized) input image
            arr = np.asarray(ref.convert("RGB").resize((w, h)), dtype=np.float32) / 127.5 - 1
            x = x * 0.1 + torch.from_numpy(arr).permute(2, 0, 1)
        y = torch.sigmoid(self.net(x))
        return (y * 255).round().to(torch.uint8).permute(0, 2, 3, 1)


class ImageAdapter(_ConvImages):
    def __init__(self, ctx: StageContext):
        super().__init__()

    def run(self, items):
        outs = []
        for item in items:
            p, text = item.params or {}, prompt_text(item.inputs)
            _wait_gate_sync(text)
            if text.startswith("crash:"):
                raise RuntimeError("simulated stage fault")
            images = (item.inputs.get("multi_modal_data") or {}).get("image") or [None]
            ref = images[0] if isinstance(images, list) else images
            h, w = int(p.get("height", 32)), int(p.get("width", 32))
            batch = self.render(h, w, int(p.get("seed") or 0), int(p.get("num_outputs_per_prompt", 1)), ref)
            outs.append({"image": [img.numpy() for img in batch]})
        return outs


class VideoAdapter(_ConvImages):
    def __init__(self, ctx: StageContext):
        super().__init__()

    def run(self, items):
        outs = []
        for item in items:
            p, text = item.params or {}, prompt_text(item.inputs)
            _wait_gate_sync(text)
            h, w = int(p.get("height", 32)), int(p.get("width", 32))
            frames = self.render(h, w, int(p.get("seed") or 0), int(p.get("num_frames", 4)))
            outs.append({"video": frames.numpy(), "fps": int(p.get("fps", 8))})
        return outs


def omni_pipeline() -> Pipeline:
    """text (llm) -> audio (streamed), plus independent image and video stages."""
    return Pipeline(
        name="test_omni",
        stages=[
            StageSpec(0, kind="llm", engine=WordEngine, output="text", final=True),
            StageSpec(
                1,
                kind="generation",
                adapter=ToneAdapter,
                output="audio",
                final=True,
                inputs=[Edge(0, process=lambda src, req: {"text": src.get("text", "")}, process_chunk=text_chunk)],
            ),
            StageSpec(2, kind="generation", adapter=ImageAdapter, output="image", final=True),
            StageSpec(
                3,
                kind="generation",
                adapter=VideoAdapter,
                output="video",
                final=True,
                default_params={"num_frames": 4, "fps": 8},
            ),
        ],
        extra_body_params={"style": str},
        info=PipelineInfo(speech=SpeechInfo(voices=("alto", "bass"))),
    )


def talking_pipeline() -> Pipeline:
    """``omni_pipeline`` declaring the rate it speaks at, as a speech model's card does: a realtime session
    announces it (``session.audio.output.format.rate``) and a client plays the deltas at it."""
    pipeline = omni_pipeline()
    return dataclasses.replace(pipeline, info=pipeline.info.with_speech(sample_rate=SAMPLE_RATE))


def image_pipeline() -> Pipeline:
    return Pipeline(
        name="test_image", stages=[StageSpec(0, kind="generation", adapter=ImageAdapter, output="image", final=True)]
    )
