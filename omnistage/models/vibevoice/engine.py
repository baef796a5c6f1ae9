"""VibeVoice's one stage: ``stages.ar.StepEngine`` over ``model.VibeVoiceModel`` (transformers'
``VibeVoiceForConditionalGeneration`` modules); every step is one LM token per request and, when it is the
speech token, one latent frame drawn by the diffusion head and decoded to audio at once (the decoded audio feeds
the next step through the semantic encoder, so the decoder runs inside the step, and the stage emits audio
itself). The requests of a step share its forwards (``model.py``: batched LM branches, diffusion head, decoder),
each on its own caches, so each equals its solo run up to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.codec_lm.codec import mono_clip
from omnistage.models.shared.folder_engine import FolderStepEngine
from omnistage.models.vibevoice.config import SAMPLE_RATE, checkpoint_defaults, parse_params, script_turns
from omnistage.models.vibevoice.model import VibeVoiceModel, VoiceRow
from omnistage.pipeline import StageContext
from omnistage.speech import SpeechInput
from omnistage.stages.ar.engine import ARRequest, Emit
from omnistage.stages.base import StageRequest


@dataclass
class VoiceRequest(ARRequest):
    ids: list[int] = field(default_factory=list)
    voice: torch.Tensor | None = None  # the processor's input_values of the voice clip
    row: VoiceRow | None = None


class VibeVoiceEngine(FolderStepEngine):
    family = "vibevoice"
    model_class = VibeVoiceModel
    read_defaults = checkpoint_defaults

    def new_request(self, req: StageRequest) -> VoiceRequest:
        params = parse_params(self.whole_input(req).params, self.defaults)
        inputs = req.inputs or {}
        info = req.speech or SpeechInput()
        for name in ("voice", "instructions"):
            if getattr(info, name) is not None:  # no preset voices: a voice is a clip (ref_audio or a registered voice)
                raise InvalidRequestError(
                    name,
                    "VibeVoice has no preset voices; speakers are 'Speaker N:' lines in "
                    "the input, and ref_audio (or a registered voice) voices the first one",
                )
        voice = None
        if info.ref_audio is not None:  # ref_text is not needed: VibeVoice's voice prompt is the clip alone
            if self.model.voice_rate is None:
                raise InvalidRequestError(
                    "ref_audio", "this checkpoint has no processor (feature extractor) for voice prompts"
                )
            voice = mono_clip(info.ref_audio, "ref_audio", self.model.voice_rate)
        steps = int(self.model.scheduler.config.num_train_timesteps)  # more cannot be scheduled (diffusers raises)
        if params.num_diffusion_steps > steps:
            raise InvalidRequestError("num_diffusion_steps", f"must be <= {steps}, got {params.num_diffusion_steps}")
        ids, values = self.model.prompt(script_turns(inputs.get("prompt")), voice)
        if len(ids) + params.max_tokens > self.model.max_positions:
            raise InvalidRequestError(
                "max_tokens",
                f"the prompt ({len(ids)} tokens) plus max_tokens "
                f"({params.max_tokens}) exceed the model's {self.model.max_positions} positions",
            )
        generator = torch.Generator()
        if params.seed is None:
            generator.seed()
        else:
            generator.manual_seed(params.seed)
        return VoiceRequest(req, ids=ids, voice=values, row=self.model.new_row(params, generator))

    def prefill_batch(self, rs: list[VoiceRequest]) -> list[Emit | Exception]:
        out: list[Emit | Exception] = []
        ok, embeds = [], []
        for r in rs:  # a voice clip the encoder fails on fails its request alone
            try:
                embeds.append(self.model.prompt_embeds(r.row, r.ids, r.voice))
                ok.append(r)
                out.append(Emit())
            except Exception as e:
                out.append(e)
        if ok:
            self.model.prefill([r.row for r in ok], [r.ids for r in ok], embeds)
        return out

    def step(self, rs: list[VoiceRequest], items: list[Any]) -> list[Emit]:
        last = [r.tokens + 1 >= r.row.params.max_tokens for r in rs]
        result = self.model.step([r.row for r in rs], last)
        emits = []
        for token, audio, done in zip(result.tokens, result.audio, last):
            if token == self.model.eos:
                emits.append(Emit(finish="stop"))
                continue
            # the last token's frame still sounds, as in generate
            data = {"audio": audio, "sample_rate": SAMPLE_RATE} if audio is not None else None
            emits.append(Emit(data, tokens=1, finish="length" if done else None))
        return emits


def build_engine(ctx: StageContext) -> VibeVoiceEngine:
    return VibeVoiceEngine(ctx)
