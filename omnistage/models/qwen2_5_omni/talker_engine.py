"""The talker stage: omnistage's step-batched autoregressive engine (``stages.ar``) over transformers' talker.

Why not vLLM: every step's input is the previous code's embedding plus a row computed from the thinker's hidden
states (``talker_model.py``); vLLM's public API conditions a request only through its prompt, so nothing public
feeds a running request a new input embedding per step. (The talker itself is a plain Qwen2 decoder: one codebook,
no nested model.)

A request arrives whole (the thinker finished: its prompt ids, reply ids, the hidden states of both and the media
grids; ``edges.py``), prefills once and then joins every step until ``codec_pad`` / ``codec_end`` or ``max_tokens``
codes (transformers' ``talker_max_new_tokens``). Each code is one ``token_ids`` item; the end code is not sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnistage.errors import InvalidRequestError
from omnistage.models.qwen2_5_omni.config import load_omni25_config
from omnistage.models.qwen_omni.talker_engine import talker_sampling  # the same SamplingParams keys + speaker
from omnistage.pipeline import StageContext
from omnistage.stages.ar.engine import ARRequest, Emit, StepEngine
from omnistage.stages.ar.kv import RequestKV
from omnistage.stages.base import StageRequest

# the thinker's reply must reach the talker's prefill with its first token and one more (the talker's input is the
# reply fed back to the thinker, its last token excluded); a shorter reply has nothing to say
NO_SPEECH = "the thinker's reply is too short to speak (fewer than 2 tokens)"


@dataclass
class _Req(ARRequest):
    inputs: Mapping[str, Any] | None = None
    row: Any = None  # talker_model.Row
    speaker: str = ""
    max_tokens: int = 0
    sampled: int = 0


class TalkerEngine(StepEngine):
    def __init__(self, ctx: StageContext):
        if ctx.model is None:
            raise ValueError("qwen2_5_omni needs a model folder")
        super().__init__(ctx)
        self.folder = Path(ctx.model)
        self.config = load_omni25_config(self.folder)

    def load_model(self) -> Any:
        from omnistage.models.qwen2_5_omni.talker_model import TalkerModel

        return TalkerModel(self.folder, *self.device_and_dtype())

    def new_request(self, req: StageRequest) -> _Req:
        from omnistage.models.qwen2_5_omni.talker_model import Row

        sampling, max_tokens, speaker = talker_sampling(req.params, self.config.sampling_defaults("talker"))
        inputs = req.inputs or {}
        name = self.config.speaker(inputs.get("speaker") or speaker)
        for key in ("prompt_token_ids", "token_ids", "thinker"):
            if inputs.get(key) is None:
                raise ValueError(f"the talker got no {key} from the thinker")
        return _Req(req, inputs=inputs, speaker=name, max_tokens=max_tokens,
                    row=Row(RequestKV(self.model.num_layers), sampling))

    def prefill(self, r: _Req) -> Emit:
        reply = [int(t) for t in r.inputs["token_ids"]]
        if len(reply) < 2:
            raise InvalidRequestError("input", NO_SPEECH)
        thinker = r.inputs["thinker"]
        bos = int(self.config.speakers[r.speaker]["bos_token"])
        embeds, positions, delta, trailing = self.model.prefill_input(
            [int(t) for t in r.inputs["prompt_token_ids"]], reply, thinker["hidden"], bos, thinker)
        return self._emit(r, self.model.prefill(r.row, embeds, positions, delta, trailing))

    def step(self, rs: list[_Req], items: list[Any]) -> list[Emit]:
        return [self._emit(r, code) for r, code in zip(rs, self.model.step([r.row for r in rs]))]

    def _emit(self, r: _Req, code: int) -> Emit:
        r.sampled += 1
        if code in self.model.eos:
            return Emit(finish="stop")
        finish = "length" if r.sampled >= r.max_tokens else None
        return Emit({"token_ids": [code]}, tokens=1, finish=finish)


def build_talker_engine(ctx: StageContext) -> TalkerEngine:
    return TalkerEngine(ctx)
