"""XTTS v2's GPT stage: ``stages.ar.StepEngine`` over ``model.XttsModel``; it emits, per step, the audio code
(``token_ids`` [1, 1]) and the latent that produced it (``latent`` [1, d]: what the decoder reads), and with
the first step the speaker embedding and the request's ``speed`` for the decoder.

Inputs: the prompt's ``prompt`` (the text) and the request's ``SpeechInput``: ``ref_audio`` (the voice to
clone; XTTS clones from the clip alone, so ``ref_text`` is not used), ``language`` (one of the checkpoint's
languages; default ``en``) and ``speed``. A clip's conditioning (the GPT's latents and the speaker
embedding) is computed once per clip content: the prefill looks it up by the clip's sha256 first.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.codec_lm.codec import mono_clip
from omnistage.models.xtts.config import (
    MAX_REF_AUDIO_S,
    VOICES,
    XttsParams,
    checkpoint_defaults,
    parse_params,
    text_language,
)
from omnistage.models.xtts.model import XttsModel, XttsRow
from omnistage.pipeline import StageContext
from omnistage.speech import SpeechInput
from omnistage.stages.ar.engine import ARRequest, Emit, StepEngine
from omnistage.stages.ar.sampling import request_generator
from omnistage.stages.base import StageRequest

CACHED_VOICES = 64  # clips whose conditioning is kept (each: 32 latents and one 512-d embedding)
MIN_REF_AUDIO_S = 0.33  # the release refuses a clip with no chunk this long
SILENT_PEAK = 1e-4


@dataclass
class XttsRequest(ARRequest):
    text_ids: list[int] = field(default_factory=list)
    clip: tuple[np.ndarray, int] | None = None
    clip_key: str = ""
    params: XttsParams | None = None
    speed: float = 1.0
    row: XttsRow | None = None


def reference_clip(speech: SpeechInput) -> tuple[np.ndarray, int]:
    """The request's clip as mono float32 at its own rate (the model resamples it as the release does)."""
    if speech.ref_audio is None:
        raise InvalidRequestError("ref_audio", "XTTS speaks in a cloned voice: give ref_audio (a clip of the voice)")
    value = speech.ref_audio
    rate = value[1] if isinstance(value, (tuple, list)) and len(value) == 2 else None
    samples = mono_clip(value, "ref_audio", rate if isinstance(rate, int) and rate > 0 else 1)
    seconds = samples.size / rate
    if seconds > MAX_REF_AUDIO_S:
        raise InvalidRequestError("ref_audio", f"the reference clip is {seconds:.1f} s; at most {MAX_REF_AUDIO_S:g} s")
    if seconds < MIN_REF_AUDIO_S:
        raise InvalidRequestError("ref_audio", f"the reference clip is {seconds:.2f} s; at least {MIN_REF_AUDIO_S} s")
    if float(np.abs(samples).max()) < SILENT_PEAK:
        raise InvalidRequestError("ref_audio", "the reference clip is silent")
    return samples, rate


def check_speed(speed: Any) -> float:
    if speed is None:
        return 1.0
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0.05 <= speed <= 20:
        raise InvalidRequestError("speed", f"expected a number from 0.05 to 20, got {speed!r}")
    return float(speed)


class XttsEngine(StepEngine):
    def __init__(self, ctx: StageContext):
        if ctx.model is None:
            raise ValueError("xtts needs a model folder")
        super().__init__(ctx)
        self.folder = Path(ctx.model)
        self.defaults = checkpoint_defaults(self.folder)
        self.voices: OrderedDict[str, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self.conditioning_runs = 0  # clips encoded (tests read it: a clip sent twice is encoded once)

    def load_model(self) -> XttsModel:
        return XttsModel(self.folder, *self.device_and_dtype())

    def new_request(self, req: StageRequest) -> XttsRequest:
        if req.stream_inputs:
            raise ValueError(f"stage {self.stage_id} takes its whole input at once (no async chunk input)")
        args = self.model.args
        p = parse_params(req.params, self.defaults, args.max_new_codes)
        text = (req.inputs or {}).get("prompt")
        if not isinstance(text, str) or not text.strip():
            raise InvalidRequestError("prompt", "the text to speak is empty")
        speech = req.speech or SpeechInput()
        if speech.voice is not None and speech.voice not in VOICES:
            raise InvalidRequestError(
                "voice", f"{speech.voice!r} is not a voice of this model; clone one with ref_audio"
            )
        ids = self.model.text_ids(text, text_language(speech.language, args.languages))
        if len(ids) + 2 > args.max_text_tokens:
            raise InvalidRequestError(
                "input", f"the text is {len(ids)} tokens; XTTS reads at most {args.max_text_tokens - 2}"
            )
        clip = reference_clip(speech)
        key = hashlib.sha256(clip[0].tobytes() + str(clip[1]).encode()).hexdigest()
        row = self.model.new_row(p, request_generator(p.sampling.temperature, p.seed))
        return XttsRequest(
            req, text_ids=ids, clip=clip, clip_key=key, params=p, speed=check_speed(speech.speed), row=row
        )

    def _conditioning(self, r: XttsRequest) -> tuple[torch.Tensor, torch.Tensor]:
        hit = self.voices.get(r.clip_key)
        if hit is None:
            hit = self.model.conditioning(*r.clip)
            self.conditioning_runs += 1
            self.voices[r.clip_key] = hit
            while len(self.voices) > CACHED_VOICES:
                self.voices.popitem(last=False)
        self.voices.move_to_end(r.clip_key)
        return hit

    def _emission(self, r: XttsRequest, code: int, latent: torch.Tensor, first: dict | None = None) -> Emit:
        data = {"token_ids": torch.tensor([[code]]), "latent": latent.detach().float().cpu()[None], **(first or {})}
        if code == self.model.args.stop_audio_token:
            return Emit(data, tokens=1, finish="stop")
        return Emit(data, tokens=1, finish="length" if r.row.emitted >= r.params.max_tokens else None)

    def prefill_batch(self, rs: list[XttsRequest]) -> list[Emit | Exception]:
        """The joining requests' conditioning (a bad clip fails its request alone), then one batched forward."""
        out: list[Emit | Exception | None] = []
        going, prompts, speakers = [], [], []
        for r in rs:
            try:
                cond, speaker = self._conditioning(r)
                going.append(r)
                prompts.append((cond, r.text_ids))
                speakers.append(speaker)
                out.append(None)
            except Exception as e:
                out.append(e)
        if going:
            try:
                results = self.model.prefill([r.row for r in going], prompts)
            except Exception as e:  # the batch's forward failed: its requests fail, not the others
                return [e if o is None else o for o in out]
            firsts = iter(
                self._emission(r, code, latent, {"speaker": speaker.float().cpu(), "speed": r.speed})
                for r, (code, latent), speaker in zip(going, results, speakers)
            )
            out = [next(firsts) if o is None else o for o in out]
        return out

    def step(self, rs: list[XttsRequest], items: list[Any]) -> list[Emit]:
        results = self.model.step([r.row for r in rs])
        return [self._emission(r, code, latent) for r, (code, latent) in zip(rs, results)]


def build_gpt_engine(ctx: StageContext) -> XttsEngine:
    return XttsEngine(ctx)
