"""XTTS v2's decoder stage: the HiFi-GAN generator over the GPT's latents (``model.decode``), as the release's
``inference`` (one decode of every latent) or ``inference_stream`` streams.

Streamed, every piece decodes all the latents so far again (the generator sees the whole utterance each time,
as the release's stream does) and sends the audio past what was sent, less an ``OVERLAP_SAMPLES`` tail held
back to cross-fade into the next piece (linear fades over the overlap); the last piece sends the rest. So
the streamed audio is the release's ``inference_stream`` output, which differs from the whole decode where
the fades fall.

A text spoken sentence by sentence: each sentence's latents are decoded alone and the audio joined (whole), or
each sentence streams as above and its last piece (``sentence_end``) closes it, the next starting afresh.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.xtts.config import OVERLAP_SAMPLES, SAMPLE_RATE
from omnistage.models.xtts.model import decode, load_vocoder
from omnistage.pipeline import StageContext
from omnistage.stages.generation.adapter import GenerationItem

PARAM_KEYS = {"chunk_frames", "seed"}  # "seed": a routed generic knob, unused here


def next_piece(wav: torch.Tensor, state: dict[str, Any], final: bool, n: int = OVERLAP_SAMPLES) -> torch.Tensor:
    """The audio of this piece from ``wav`` (the decode of every latent so far), as the release's
    ``handle_chunks`` cuts it (Python's slice bounds included); ``state`` keeps the previous decode's length and
    the held-back tail."""
    wav = wav.clone()  # the fade writes into the piece (a view of wav), and wav may be an inference-mode tensor
    end = None if final else -n
    prev, tail = state.get("prev_len"), state.get("tail")
    piece = wav[:end] if prev is None else wav[prev - n : end]
    if tail is not None:
        if n > len(piece):  # too little new audio to fade over: send what follows the last piece, hold nothing
            state["prev_len"], state["tail"] = len(wav), None
            return wav[prev - n :]
        fade_in = piece[:n] * torch.linspace(0.0, 1.0, n)
        piece[:n] = tail * torch.linspace(1.0, 0.0, n)
        piece[:n] += fade_in
    state["tail"] = None if final else wav[-n:]
    state["prev_len"] = len(wav)
    return piece


class XttsDecoderAdapter:
    def __init__(self, ctx: StageContext):
        if ctx.model is None:
            raise ValueError("xtts needs a model folder")
        device = f"cuda:{ctx.devices[0]}" if ctx.devices and torch.cuda.is_available() else "cpu"
        self.vocoder = load_vocoder(Path(ctx.model), device)

    def run(self, items: list[GenerationItem]) -> list[Any]:
        out: list[Any] = []
        for item in items:
            try:
                out.append(self._one(item))
            except (InvalidRequestError, ValueError) as e:
                out.append(e)
        return out

    def _one(self, item: GenerationItem) -> dict[str, Any]:
        params = dict(item.params or {})
        unknown = sorted(k for k, v in params.items() if v is not None and k not in PARAM_KEYS)
        if unknown:
            raise InvalidRequestError(unknown[0], "not a parameter of XTTS's decoder (it takes chunk_frames)")
        n = params.get("chunk_frames")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise InvalidRequestError("chunk_frames", f"expected a positive integer, got {n!r}")
        inputs = item.inputs
        if "latents" not in inputs:  # a stream's last feed with nothing new after its last piece
            return {"audio": torch.zeros(0), "sample_rate": SAMPLE_RATE}
        speaker, speed = inputs["speaker"], float(inputs.get("speed") or 1.0)
        if inputs.get("streamed"):
            ends = bool(inputs.get("sentence_end"))
            wav = next_piece(decode(self.vocoder, inputs["latents"], speaker, speed), item.state, item.last or ends)
            if ends:  # the next sentence streams afresh
                item.state.pop("prev_len", None)
                item.state.pop("tail", None)
            return {"audio": wav.cpu(), "sample_rate": SAMPLE_RATE}
        sentences = inputs.get("sentences")
        latents = inputs["latents"]
        counts = [len(latents)] if sentences is None else torch.unique_consecutive(sentences, return_counts=True)[1]
        pieces = [decode(self.vocoder, part, speaker, speed) for part in torch.split(latents, list(map(int, counts)))]
        return {"audio": torch.cat(pieces).cpu(), "sample_rate": SAMPLE_RATE}
