"""CSM's backbone stage: ``stages.ar.StepEngine`` over ``model.CsmModel``; it emits one ``token_ids``
row [K codes] per frame.

Inputs: the prompt's ``prompt`` (the text to speak) and the request's ``SpeechInput`` with ``voice`` (a speaker
id, ``"0"`` by default), ``ref_audio`` (``(samples, rate)``) + ``ref_text`` (a reference clip and its transcript:
an earlier turn of the same speaker, CSM's way of holding a voice), and ``context`` (earlier turns, ``SpeechTurn``
speaker / text / audio, before the reference turn).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omnistage.errors import InvalidRequestError
from omnistage.models.csm.config import CsmParams, checkpoint_defaults, parse_params
from omnistage.models.csm.model import CsmModel, CsmRow, Turn, check_turn
from omnistage.models.shared.codec_lm.codec import mono_clip
from omnistage.models.shared.folder_engine import FolderStepEngine
from omnistage.pipeline import StageContext
from omnistage.speech import SpeechInput
from omnistage.stages.ar.engine import ARRequest, Emit
from omnistage.stages.ar.kv import RequestKV
from omnistage.stages.ar.sampling import request_generator
from omnistage.stages.base import StageRequest

ENGLISH = {"en", "english", "auto"}  # the release speaks English only


@dataclass
class CsmRequest(ARRequest):
    turns: list[Turn] = field(default_factory=list)
    params: CsmParams | None = None
    row: CsmRow | None = None


def request_turns(text: Any, speech: SpeechInput | None, rate: int) -> list[Turn]:
    """The conversation a request asks for, its last turn the text to speak."""
    speech = speech or SpeechInput()
    speaker = speech.voice if speech.voice is not None else "0"
    check_turn(speaker, text, "")
    if speech.instructions is not None:
        raise InvalidRequestError("instructions", "CSM takes no instructions; give context turns instead")
    language = speech.language
    if language is not None and language.lower() not in ENGLISH:
        raise InvalidRequestError("language", f"CSM speaks English only, got {language!r}")
    turns: list[Turn] = []
    for i, t in enumerate(speech.context or ()):
        where = f"context[{i}]."
        check_turn(t.speaker, t.text, where)
        turns.append(Turn(t.speaker, t.text, mono_clip(t.audio, where + "audio", rate)))
    ref_audio, ref_text = speech.ref_audio, speech.ref_text
    if ref_audio is not None:
        if ref_text is None or not ref_text.strip():
            raise InvalidRequestError("ref_text", "CSM needs the transcript of ref_audio (it becomes an earlier turn)")
        turns.append(Turn(speaker, ref_text, mono_clip(ref_audio, "ref_audio", rate)))
    elif ref_text is not None:
        raise InvalidRequestError("ref_text", "given without ref_audio")
    turns.append(Turn(speaker, text))
    return turns


class CsmEngine(FolderStepEngine):
    family = "csm"
    model_class = CsmModel
    read_defaults = checkpoint_defaults

    def new_request(self, req: StageRequest) -> CsmRequest:
        params = parse_params(self.whole_input(req).params, self.defaults)
        turns = request_turns((req.inputs or {}).get("prompt"), req.speech, self.model.sample_rate)
        generator = request_generator(max(params.backbone.temperature, params.depth.temperature), params.seed)
        row = CsmRow(RequestKV(self.model.num_layers), params.backbone, params.depth, generator)
        return CsmRequest(req, turns=turns, params=params, row=row)

    def prefill(self, r: CsmRequest) -> Emit:
        embeds = self.model.prompt_embeds(r.turns)
        limit = self.model.max_positions
        if embeds.shape[0] + r.params.max_tokens > limit:  # RoPE would run past what the model was trained on
            raise InvalidRequestError(
                "max_tokens",
                f"the prompt ({embeds.shape[0]} positions, context included) "
                f"plus max_tokens ({r.params.max_tokens} frames) exceed the model's {limit}",
            )
        self.model.prefill(r.row, embeds)
        return Emit()

    def step(self, rs: list[CsmRequest], items: list[Any]) -> list[Emit]:
        frames = self.model.frames([r.row for r in rs])
        emits: list[Emit] = []
        going: list[int] = []
        for i, r in enumerate(rs):
            frame = frames[i]
            if self.model.is_end(frame):  # the end frame is not speech
                emits.append(Emit(finish="stop"))
                continue
            done = r.tokens + 1 >= r.params.max_tokens
            emits.append(Emit({"token_ids": frame.unsqueeze(0).clone()}, tokens=1, finish="length" if done else None))
            if not done:
                going.append(i)
        if going:
            self.model.advance([rs[i].row for i in going], frames[going])
        return emits


def build_backbone_engine(ctx: StageContext) -> CsmEngine:
    return CsmEngine(ctx)
