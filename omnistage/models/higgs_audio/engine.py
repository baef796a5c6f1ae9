"""Higgs Audio v2's LM stage: ``stages.ar.StepEngine`` over ``model.HiggsModel``; it emits one ``token_ids``
row [N codes] per un-delayed codec frame.

Inputs: the prompt's ``prompt`` (the text to speak; several speakers as the release writes them,
``[SPEAKER0] ... [SPEAKER1] ...``) and the request's ``SpeechInput`` with ``instructions`` (the scene
description: the release's "scene" turn, e.g. ``Audio is recorded from a quiet room.`` or
``SPEAKER0: feminine``), ``voice`` (``default``: the model's own choice of voice), and ``ref_audio``
(``(samples, rate)``) + ``ref_text`` (a voice to clone and its transcript: an earlier exchange of the
conversation, the transcript a user turn and the clip the assistant's answer, as the release clones). The clip
is encoded by the checkpoint's audio tokenizer (``shared/higgs_tokenizer/encoder.py``) in the prefill.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.higgs_audio.config import (
    MAX_REF_AUDIO_S,
    SAMPLE_RATE,
    SYSTEM_PROMPT,
    VOICES,
    HiggsParams,
    checkpoint_defaults,
    parse_params,
)
from omnistage.models.higgs_audio.model import HiggsModel, HiggsRow
from omnistage.models.shared.codec_lm.codec import mono_clip
from omnistage.models.shared.folder_engine import FolderStepEngine
from omnistage.models.shared.speech_request import preset_voice, text_to_speak
from omnistage.pipeline import StageContext
from omnistage.speech import SpeechInput
from omnistage.stages.ar.engine import ARRequest, Emit
from omnistage.stages.ar.kv import RequestKV
from omnistage.stages.base import StageRequest


@dataclass
class HiggsRequest(ARRequest):
    messages: list[dict] = field(default_factory=list)
    clips: list[np.ndarray] = field(default_factory=list)  # the conversation's audio items, at the codec's rate
    params: HiggsParams | None = None
    row: HiggsRow | None = None


def request_messages(text: Any, speech: SpeechInput | None, rate: int) -> tuple[list[dict], list[np.ndarray]]:
    """The conversation a request asks for (the release's chat: system, optional scene, a cloned voice's
    transcript and clip as an earlier exchange, the text) and its clips (mono float32 at ``rate``)."""
    text = text_to_speak(text)
    info = preset_voice(speech, VOICES, "clone one with ref_audio")
    messages: list[dict] = [{"role": "system", "content": SYSTEM_PROMPT}]
    scene = info.instructions
    if scene is not None and scene.strip():
        messages.append({"role": "scene", "content": scene})
    clips: list[np.ndarray] = []
    ref_audio, ref_text = info.ref_audio, info.ref_text
    if ref_audio is not None:
        clip = mono_clip(ref_audio, "ref_audio", rate)
        if clip.size > MAX_REF_AUDIO_S * rate:
            raise InvalidRequestError(
                "ref_audio", f"the reference clip is {clip.size / rate:.1f} s; at most {MAX_REF_AUDIO_S:g} s"
            )
        if ref_text is None or not ref_text.strip():
            raise InvalidRequestError("ref_text", "Higgs Audio clones from a clip and its transcript: give ref_text")
        messages += [
            {"role": "user", "content": ref_text},
            {"role": "assistant", "content": [{"type": "audio"}]},
        ]
        clips.append(clip)
    elif ref_text is not None:
        raise InvalidRequestError("ref_text", "given without ref_audio")
    messages.append({"role": "user", "content": text})
    return messages, clips


class HiggsEngine(FolderStepEngine):
    family = "higgs_audio"
    model_class = HiggsModel
    read_defaults = checkpoint_defaults

    def new_request(self, req: StageRequest) -> HiggsRequest:
        p = parse_params(self.whole_input(req).params, self.defaults)
        messages, clips = request_messages((req.inputs or {}).get("prompt"), req.speech, SAMPLE_RATE)
        generator = None
        if p.sampling.temperature > 0 or (p.ras_win_len and p.ras_win_max_num_repeat):  # RAS draws even greedy
            generator = torch.Generator()
            if p.seed is None:
                generator.seed()
            else:
                generator.manual_seed(p.seed)
        row = HiggsRow(RequestKV(self.model.num_layers), p.sampling, generator, p.ras_win_len, p.ras_win_max_num_repeat)
        return HiggsRequest(req, messages=messages, clips=clips, params=p, row=row)

    def _prompt(self, r: HiggsRequest) -> tuple[list[int], torch.Tensor | None]:
        ids, audio = self.model.prompt(r.messages, [self.model.encoder.encode(c) for c in r.clips])
        limit = self.model.max_positions
        if len(ids) + r.params.max_tokens > limit:  # RoPE would run past what the model was trained on
            raise InvalidRequestError(
                "max_tokens",
                f"the prompt ({len(ids)} positions) plus max_tokens ({r.params.max_tokens}) exceed the model's {limit}",
            )
        return ids, audio

    def prefill_batch(self, rs: list[HiggsRequest]) -> list[Emit | Exception]:
        """The joining requests' prompts (a bad one fails alone), then one batched forward over all of them."""
        out: list[Emit | Exception] = []
        going: list[HiggsRequest] = []
        prompts: list[tuple[list[int], torch.Tensor | None]] = []
        for r in rs:
            try:
                prompts.append(self._prompt(r))
                going.append(r)
                out.append(Emit())
            except Exception as e:
                out.append(e)
        if going:
            try:
                self.model.prefill([r.row for r in going], prompts)
            except Exception as e:  # the batch's forward failed: its requests fail, not the others
                out = [e if isinstance(o, Emit) else o for o in out]
        return out

    def step(self, rs: list[HiggsRequest], items: list[Any]) -> list[Emit]:
        emits: list[Emit] = []
        going: list[int] = []
        frames, ended = self.model.choose([r.row for r in rs])
        for i, r in enumerate(rs):
            if ended[i]:  # all codebooks ended: not audio
                emits.append(Emit(finish="stop"))
                continue
            out = self.model.undelayed(r.row, frames[i])
            done = r.row.rows >= r.params.max_tokens
            data = None if out is None else {"token_ids": out.unsqueeze(0)}
            emits.append(Emit(data, tokens=0 if out is None else 1, finish="length" if done else None))
            if not done:
                going.append(i)
        if going:
            self.model.advance([rs[i].row for i in going], frames if len(going) == len(rs) else frames[going])
        return emits


def build_lm_engine(ctx: StageContext) -> HiggsEngine:
    return HiggsEngine(ctx)
