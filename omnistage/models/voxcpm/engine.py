"""VoxCPM2's LM stage: ``stages.ar.StepEngine`` over ``model.VoxCPMModel``; it emits one ``latent`` patch
[P, D] per step (the local DiT of every running request in one batch), and, for a continued clip, its last
patches once as ``context`` (the decoder decodes them in front of the speech and drops their samples).

Inputs: the prompt's ``prompt`` (the text to speak; whitespace runs become one space, as the release does) and
the request's ``SpeechInput``: ``voice`` (``default`` only), ``ref_audio`` (a clip to clone: alone, the
release's reference mode; with ``ref_text``, its transcript, the speech continues the clip). The clip is
encoded by the checkpoint's VAE in the prefill. ``language`` and ``instructions`` are refused: the release
takes neither (it reads the language from the text).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.codec_lm.codec import mono_clip
from omnistage.models.shared.folder_engine import FolderStepEngine
from omnistage.models.shared.speech_request import preset_voice, text_to_speak
from omnistage.models.voxcpm.config import MAX_REF_AUDIO_S, VOICES, VoxParams, parse_params
from omnistage.models.voxcpm.model import VoxCPMModel, VoxRow
from omnistage.pipeline import StageContext
from omnistage.speech import SpeechInput
from omnistage.stages.ar.engine import ARRequest, Emit
from omnistage.stages.base import StageRequest


@dataclass(eq=False)
class VoxRequest(ARRequest):
    text: str = ""
    clip: np.ndarray | None = None  # mono float32 at the VAE's input rate
    clip_text: str | None = None
    params: VoxParams | None = None
    row: VoxRow | None = None


def speech_fields(speech: SpeechInput | None, rate: int) -> tuple[np.ndarray | None, str | None]:
    """The clip to clone (at ``rate``) and its transcript, each checked; the fields VoxCPM2 cannot take refused."""
    info = preset_voice(speech, VOICES, "clone one with ref_audio")
    for name in ("language", "instructions"):
        if getattr(info, name) is not None:
            raise InvalidRequestError(name, "VoxCPM2 takes no " + name + " (it reads the language from the text)")
    if info.ref_audio is None:
        if info.ref_text is not None:
            raise InvalidRequestError("ref_text", "given without ref_audio")
        return None, None
    clip = mono_clip(info.ref_audio, "ref_audio", rate)
    if clip.size > MAX_REF_AUDIO_S * rate:
        raise InvalidRequestError("ref_audio", f"the clip is {clip.size / rate:.1f} s; at most {MAX_REF_AUDIO_S:g} s")
    if not np.any(clip):
        raise InvalidRequestError("ref_audio", "the clip is silent")
    text = info.ref_text
    if text is not None and not text.strip():
        raise InvalidRequestError("ref_text", "empty; leave it out to clone from the clip alone")
    return clip, text


class VoxEngine(FolderStepEngine):
    family = "voxcpm"
    model_class = VoxCPMModel

    def new_request(self, req: StageRequest) -> VoxRequest:
        p = parse_params(self.whole_input(req).params)
        text = text_to_speak((req.inputs or {}).get("prompt"))
        clip, clip_text = speech_fields(req.speech, self.model.vae.sample_rate)
        text = re.sub(r"\s+", " ", text.replace("\n", " "))
        return VoxRequest(req, text=text, clip=clip, clip_text=clip_text, params=p)

    def prefill(self, r: VoxRequest) -> Emit:
        m, p = self.model, r.params
        built = m.prompt.build(r.text, r.clip, r.clip_text)
        steps = min(int(built.target_tokens * 6 + 10), p.max_tokens)  # the release's cap on the steps
        if len(built.tokens) + steps > m.max_positions:
            field = "ref_audio" if r.clip is not None and len(built.tokens) >= m.max_positions else "max_tokens"
            raise InvalidRequestError(
                field,
                f"the prompt ({len(built.tokens)} positions) plus {steps} steps exceed the model's {m.max_positions}",
            )
        generator = None
        if p.temperature > 0:
            generator = torch.Generator()
            if p.seed is None:
                generator.seed()
            else:
                generator.manual_seed(p.seed)
        r.row = m.new_row(generator, p.temperature, p.cfg_value, p.timesteps, p.min_tokens, steps)
        m.prefill(r.row, built.tokens, built.feats, built.text_mask, built.audio_mask)
        return Emit({"context": built.context} if built.context is not None else None)

    def step(self, rs: list[VoxRequest], items: list[Any]) -> list[Emit]:
        patches, ended = self.model.step([r.row for r in rs])
        emits = []
        for i, r in enumerate(rs):
            finish = "stop" if ended[i] else "length" if r.row.steps >= r.row.max_len else None
            emits.append(Emit({"latent": patches[i].contiguous()}, tokens=1, finish=finish))
        return emits


def build_lm_engine(ctx: StageContext) -> VoxEngine:
    return VoxEngine(ctx)
