"""XTTS v2's GPT stage: ``stages.ar.StepEngine`` over ``model.XttsModel``; it emits, per step, the audio code
(``token_ids`` [1, 1]) and the latent that produced it (``latent`` [1, d]: what the decoder reads), and with
the first step the speaker embedding and the request's ``speed`` for the decoder.

Inputs: the prompt's ``prompt`` (the text) and the request's ``SpeechInput``: ``ref_audio`` (the voice to
clone; XTTS clones from the clip alone, so ``ref_text`` is not used), ``language`` (one of the checkpoint's
languages; default ``en``), ``speed`` and ``enable_text_splitting`` (the release's option, off by default: the
text cut into sentences, ``sentences.py``, each generated from a fresh prompt in turn, the request's sampler
going on from one to the next as the release's global one does; between two, a step emits ``sentence_end``
alone, where the decoder closes the sentence's audio). A clip's conditioning (the GPT's latents and the speaker
embedding) is computed once per clip content: the prefill looks it up by the clip's sha256 first.
"""

from __future__ import annotations

import hashlib
import logging
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
from omnistage.models.xtts.sentences import char_limit, split_text
from omnistage.pipeline import StageContext
from omnistage.speech import SpeechInput
from omnistage.stages.ar.engine import ARRequest, Emit, StepEngine
from omnistage.stages.ar.sampling import request_generator
from omnistage.stages.base import StageRequest

CACHED_VOICES = 64  # clips whose conditioning is kept (each: 32 latents and one 512-d embedding)
MIN_REF_AUDIO_S = 0.33  # the release refuses a clip with no chunk this long
SILENT_PEAK = 1e-4
logger = logging.getLogger(__name__)


@dataclass
class XttsRequest(ARRequest):
    sentences: list[list[int]] = field(default_factory=list)  # each sentence's text ids, spoken in turn
    sentence: int = 0  # the one being generated
    between: bool = False  # a sentence ended and another follows: the next step marks the end, then prefills
    conditioning: tuple[torch.Tensor, torch.Tensor] | None = None
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
        sentences = self._sentences(text, text_language(speech.language, args.languages), speech)
        clip = reference_clip(speech)
        key = hashlib.sha256(clip[0].tobytes() + str(clip[1]).encode()).hexdigest()
        row = self.model.new_row(p, request_generator(p.sampling.temperature, p.seed))
        return XttsRequest(
            req, sentences=sentences, clip=clip, clip_key=key, params=p, speed=check_speed(speech.speed), row=row
        )

    def _sentences(self, text: str, language: str, speech: SpeechInput) -> list[list[int]]:
        """The text ids of each sentence the request speaks (one, unless it asks for splitting)."""
        pieces = split_text(text, language) if speech.enable_text_splitting else [text]
        out = []
        for piece in pieces:
            if len(piece) > char_limit(language):  # the release warns and speaks it: the audio may end early
                logger.warning(
                    "XTTS: %d characters, over the %s limit of %d", len(piece), language, char_limit(language)
                )
            ids = self.model.text_ids(piece, language)
            if len(ids) + 2 > self.model.args.max_text_tokens:
                raise InvalidRequestError(
                    "input",
                    f"a sentence is {len(ids)} tokens; XTTS reads at most {self.model.args.max_text_tokens - 2}"
                    + ("" if speech.enable_text_splitting else " (enable_text_splitting cuts a text in sentences)"),
                )
            out.append(ids)
        return out

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
        data = {
            "token_ids": torch.tensor([[code]]),
            "latent": latent.detach().float().cpu()[None],
            "sentence": torch.tensor([r.sentence]),
            **(first or {}),
        }
        ended = code == self.model.args.stop_audio_token or r.row.emitted >= r.params.max_tokens
        if ended and r.sentence + 1 < len(r.sentences):  # the release's next sentence: a new generate call
            r.between = True
            return Emit(data, tokens=1)
        if code == self.model.args.stop_audio_token:
            return Emit(data, tokens=1, finish="stop")
        return Emit(data, tokens=1, finish="length" if r.row.emitted >= r.params.max_tokens else None)

    def prefill_batch(self, rs: list[XttsRequest]) -> list[Emit | Exception]:
        """The joining requests' conditioning (a bad clip fails its request alone), then one batched forward."""
        out: list[Emit | Exception | None] = []
        going, prompts, speakers = [], [], []
        for r in rs:
            try:
                r.conditioning = cond, speaker = self._conditioning(r)
                going.append(r)
                prompts.append((cond, r.sentences[0]))
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
        """One code for every row generating; a row whose sentence ended emits ``sentence_end`` and starts
        its next sentence (a fresh cache and penalty set, the same sampler), whose prompt runs next step."""
        out: dict[int, Emit] = {}
        stepping, starting = [], []
        for i, r in enumerate(rs):
            if r.between:
                out[i] = Emit({"sentence_end": torch.tensor([r.sentence])})
                r.between, r.sentence = False, r.sentence + 1
                r.row = self.model.new_row(r.params, r.row.generator)
            elif r.row.emitted == 0:
                starting.append(i)
            else:
                stepping.append(i)
        if starting:
            prompts = [(rs[i].conditioning[0], rs[i].sentences[rs[i].sentence]) for i in starting]
            for i, (code, latent) in zip(starting, self.model.prefill([rs[i].row for i in starting], prompts)):
                out[i] = self._emission(rs[i], code, latent)
        if stepping:
            for i, (code, latent) in zip(stepping, self.model.step([rs[i].row for i in stepping])):
                out[i] = self._emission(rs[i], code, latent)
        return [out[i] for i in range(len(rs))]


def build_gpt_engine(ctx: StageContext) -> XttsEngine:
    return XttsEngine(ctx)
