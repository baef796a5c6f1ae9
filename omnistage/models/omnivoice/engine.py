"""OmniVoice's code stage: ``stages.ar.StepEngine`` over ``model.OmniVoiceCodes``; each step is one unmasking
step of every running request in one forward (requests at different steps and of different lengths), and a
request emits its whole utterance's codes — ``token_ids`` [frames, 8] — with its last step (nothing of it is
known before).

Inputs: the prompt's ``prompt`` (the text) and the request's ``SpeechInput`` with ``voice``
(``default``), ``instructions`` (voice design: ``female, low pitch``), ``language`` (an id or English name),
``speed``, and ``ref_audio`` (``(samples, rate)``) + ``ref_text`` (a voice to clone and its transcript; the
clip is encoded in the prefill, ``clone.py``). Params: ``num_inference_steps`` (unmasking steps), ``guidance_scale``, ``t_shift``,
``layer_penalty_factor``, ``position_temperature``, ``seed`` and ``duration`` (seconds: a fixed length
instead of the estimate from the text).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.omnivoice.clone import clip_codes, with_end_punctuation
from omnistage.models.omnivoice.config import (
    FRAME_RATE,
    GUIDANCE_SCALE,
    LAYER_PENALTY_FACTOR,
    MAX_DURATION_S,
    MAX_REF_AUDIO_S,
    NUM_STEP,
    PARAM_KEYS,
    POSITION_TEMPERATURE,
    SAMPLE_RATE,
    T_SHIFT,
    VOICES,
)
from omnistage.models.omnivoice.model import CodeRequest, OmniVoiceCodes
from omnistage.models.omnivoice.text import estimate_frames, language_id, voice_design
from omnistage.models.shared.codec_lm.codec import mono_clip
from omnistage.models.shared.folder_engine import FolderStepEngine
from omnistage.models.shared.speech_request import preset_voice, text_to_speak
from omnistage.pipeline import StageContext
from omnistage.speech import SpeechInput
from omnistage.stages.ar.engine import ARRequest, Emit
from omnistage.stages.ar.params import StageParams
from omnistage.stages.base import StageRequest

DEFAULTS = {
    "num_inference_steps": NUM_STEP,
    "guidance_scale": GUIDANCE_SCALE,
    "t_shift": T_SHIFT,
    "layer_penalty_factor": LAYER_PENALTY_FACTOR,
    "position_temperature": POSITION_TEMPERATURE,
}


@dataclass(frozen=True)
class Utterance:
    """What one request asks for, checked."""

    text: str
    language: str | None
    instruct: str | None
    target_len: int | None  # frames; None: estimated once the reference clip's length is known
    speed: float
    clip: np.ndarray | None  # the voice to clone (mono, the codec's rate) and its transcript
    ref_text: str | None
    num_step: int
    knobs: dict[str, float]  # guidance_scale, layer_penalty, position_temperature
    t_shift: float
    seed: int


def parse_request(text: Any, speech: SpeechInput | None, params: Any) -> Utterance:
    text = text_to_speak(text)
    info = preset_voice(speech, VOICES, "design one with instructions")
    clip, ref_text = None, info.ref_text
    if info.ref_audio is not None:
        clip = mono_clip(info.ref_audio, "ref_audio", SAMPLE_RATE)
        if clip.size > MAX_REF_AUDIO_S * SAMPLE_RATE:
            raise InvalidRequestError(
                "ref_audio", f"the reference clip is {clip.size / SAMPLE_RATE:.1f} s; at most {MAX_REF_AUDIO_S:g} s"
            )
        if ref_text is None or not ref_text.strip():
            raise InvalidRequestError("ref_text", "OmniVoice clones from a clip and its transcript: give ref_text")
        ref_text = with_end_punctuation(ref_text)
    elif ref_text is not None:
        raise InvalidRequestError("ref_text", "given without ref_audio")
    language, instructions = info.language, info.instructions
    speed = info.speed if info.speed is not None else 1.0
    if not 0.25 <= speed <= 4.0:
        raise InvalidRequestError("speed", f"expected a number in 0.25..4, got {speed!r}")
    p = StageParams(params, DEFAULTS, PARAM_KEYS, "OmniVoice's code stage", "")
    num_step = int(p.number("num_inference_steps", 1, integer=True))
    knobs = {
        "guidance_scale": float(p.number("guidance_scale", 0)),
        "layer_penalty": float(p.number("layer_penalty_factor", 0)),
        "position_temperature": float(p.number("position_temperature", 0)),
    }
    t_shift = float(p.number("t_shift", 0, strict=True))
    seed = p.seed()
    if seed is None:
        seed = int(torch.seed() % 2**63)
    if p.merged.get("duration") is not None:
        duration = float(p.number("duration", 0, strict=True))
        if duration > MAX_DURATION_S:
            raise InvalidRequestError("duration", f"at most {MAX_DURATION_S:g} s, got {duration:g}")
        target = max(1, int(duration * FRAME_RATE))
    else:
        target = None if clip is not None else checked_estimate(text, float(speed))
    return Utterance(
        text,
        language_id(language),
        voice_design(instructions, text),
        target,
        float(speed),
        clip,
        ref_text,
        num_step,
        knobs,
        t_shift,
        seed,
    )


def checked_estimate(text: str, speed: float, ref_text: str | None = None, ref_frames: int | None = None) -> int:
    target = estimate_frames(text, speed, ref_text, ref_frames)
    if target > MAX_DURATION_S * FRAME_RATE:
        raise InvalidRequestError("prompt", f"the text would take over {MAX_DURATION_S:g} s to speak")
    return target


@dataclass(eq=False)
class OmniVoiceRequest(ARRequest):
    utterance: Utterance | None = None
    codes: CodeRequest | None = None
    ref_rms: float | None = None


class OmniVoiceEngine(FolderStepEngine):
    family = "omnivoice"

    def load_model(self) -> OmniVoiceCodes:
        from omnistage.models.shared.higgs_tokenizer.encoder import HiggsAudioEncoder

        model = OmniVoiceCodes(self.folder, *self.device_and_dtype())
        self.encoder = HiggsAudioEncoder(self.folder / "audio_tokenizer", *self.device_and_dtype())
        return model

    def new_request(self, req: StageRequest) -> OmniVoiceRequest:
        self.whole_input(req)
        return OmniVoiceRequest(req, utterance=parse_request((req.inputs or {}).get("prompt"), req.speech, req.params))

    def prefill(self, r: OmniVoiceRequest) -> Emit:
        u = r.utterance
        ref_codes, target = None, u.target_len
        if u.clip is not None:
            ref_codes, r.ref_rms = clip_codes(self.encoder, u.clip, SAMPLE_RATE, self.encoder.cfg.hop_length)
            if target is None:
                target = checked_estimate(u.text, u.speed, u.ref_text, ref_codes.shape[-1])
        prompt, audio_start = self.model.prompt(
            u.text, target, language=u.language, instruct=u.instruct, ref_text=u.ref_text, ref_codes=ref_codes
        )
        r.codes = self.model.new_request(
            prompt, audio_start, target, seed=u.seed, num_step=u.num_step, t_shift=u.t_shift, **u.knobs
        )
        return Emit()

    def step(self, rs: list[OmniVoiceRequest], items: list[Any]) -> list[Emit]:
        self.model.step([r.codes for r in rs])
        emits = []
        for r in rs:
            if r.codes.done:
                frames = r.codes.codes.T.contiguous()
                data = {"token_ids": frames} if r.ref_rms is None else {"token_ids": frames, "ref_rms": r.ref_rms}
                emits.append(Emit(data, tokens=frames.shape[0], finish="stop"))
            else:
                emits.append(Emit())
        return emits


def build_code_engine(ctx: StageContext) -> OmniVoiceEngine:
    return OmniVoiceEngine(ctx)
