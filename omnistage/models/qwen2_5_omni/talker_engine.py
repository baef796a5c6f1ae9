"""The talker stage: omnistage's step-batched autoregressive engine (``stages.ar``) over transformers' talker.

Why not vLLM: every step's input is the previous code's embedding plus a row computed from the thinker's hidden
states (``talker_model.py``); vLLM's public API conditions a request only through its prompt, so nothing public
feeds a running request a new input embedding per step. (The talker itself is a plain Qwen2 decoder: one codebook,
no nested model.)

A request's inputs (``edges.py``: the thinker's prompt ids, reply ids, hidden states of the prompt and of the reply
fed back, the media grids) arrive whole or streamed as the thinker makes them. It prefills once the prompt's rows
and the first reply token's have come, and joins a step once the row that step reads has (reply token k + 1's for
step k, then ``tts_text_end``, then ``tts_text_pad``, once the thinker finished) — so streamed or whole, every step
computes the same thing — until ``codec_pad`` / ``codec_end`` or ``max_tokens`` codes (transformers'
``talker_max_new_tokens``). Each code is one ``token_ids`` item; the end code is not sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omnistage.models.qwen2_5_omni.config import load_omni25_config
from omnistage.models.shared.folder_engine import FolderStepEngine
from omnistage.models.shared.omni.sampling import talker_sampling  # the same SamplingParams keys + speaker
from omnistage.pipeline import StageContext
from omnistage.stages.ar.engine import ARRequest, Emit
from omnistage.stages.ar.kv import RequestKV
from omnistage.stages.base import StageRequest


@dataclass
class Qwen25TalkerRequest(ARRequest):
    row: Any = None  # talker_model.Qwen25TalkerRow
    speaker: str = ""  # the talker's own ``speaker`` param (checked), else the default
    voice: str | None = None  # the request's voice, which wins
    max_tokens: int = 0
    sampled: int = 0
    prompt_ids: list[int] | None = None
    reply: list[int] = field(default_factory=list)
    rows: list[Any] = field(default_factory=list)  # the thinker's hidden states, one [D] row per token (views)
    media: Mapping[str, Any] | None = None
    text_done: bool = False  # the thinker finished: no more reply tokens or rows


class TalkerEngine(FolderStepEngine):
    family = "qwen2_5_omni"

    def __init__(self, ctx: StageContext):
        super().__init__(ctx)
        self.config = load_omni25_config(self.folder)

    def load_model(self) -> Any:
        from omnistage.models.qwen2_5_omni.talker_model import TalkerModel

        return TalkerModel(self.folder, *self.device_and_dtype())

    def new_request(self, req: StageRequest) -> Qwen25TalkerRequest:
        from omnistage.models.qwen2_5_omni.talker_model import Qwen25TalkerRow

        sampling, max_tokens, speaker = talker_sampling(req.params, self.config.sampling_defaults("talker"))
        r = Qwen25TalkerRequest(
            req,
            speaker=self.config.speaker(speaker),
            max_tokens=max_tokens,
            row=Qwen25TalkerRow(RequestKV(self.model.num_layers), sampling),
        )
        self._add(r, req.inputs or {}, last=not req.stream_inputs)
        return r

    def _add(self, r: Qwen25TalkerRequest, chunk: Mapping[str, Any], last: bool) -> None:
        if chunk.get("speaker") is not None:  # the request's voice (edges.py): checked at prefill, where a bad one
            r.voice = chunk["speaker"]  # fails this request alone
        if chunk.get("prompt_token_ids") is not None:
            r.prompt_ids = [int(t) for t in chunk["prompt_token_ids"]]
        if chunk.get("media") is not None:
            r.media = chunk["media"]
        if chunk.get("token_ids") is not None:
            r.reply.extend(int(t) for t in chunk["token_ids"])
        if chunk.get("rows") is not None:
            r.rows.extend(chunk["rows"].unbind(0))
        r.text_done = r.text_done or last

    def add_input(self, r: Qwen25TalkerRequest, chunk: Mapping[str, Any], last: bool) -> None:
        if r.text_done:
            raise ValueError(f"stage {self.stage_id}: input fed to {r.request_id!r} after its last chunk")
        self._add(r, chunk, last)

    def prefill_ready(self, r: Qwen25TalkerRequest) -> bool:
        """Once the prompt's rows and the first reply token's have come, or the thinker ended (prefill then fails)."""
        return r.text_done or (r.prompt_ids is not None and len(r.rows) > len(r.prompt_ids))

    def prefill(self, r: Qwen25TalkerRequest) -> Emit:
        if r.prompt_ids is None or not r.rows:
            raise ValueError("the talker got no prompt or hidden states from the thinker")
        if len(r.reply) < 2:
            # the talker's input is the reply fed back to the thinker, its last token excluded: a thinker that
            # stopped on its first token left nothing to say, so the talker ends without a code (no audio)
            return Emit(finish="stop")
        n = len(r.prompt_ids)
        if len(r.rows) <= n:
            raise ValueError(f"the thinker sent {len(r.rows)} hidden states for a {n}-token prompt and a reply")
        bos = int(self.config.speakers[self.config.speaker(r.voice) if r.voice else r.speaker]["bos_token"])
        embeds, positions, delta = self.model.prefill_input(r.prompt_ids, r.reply[0], r.rows[: n + 1], bos, r.media)
        return self._emit_code(r, self.model.prefill(r.row, embeds, positions, delta))

    def ready(self, r: Qwen25TalkerRequest) -> Any:
        """What step k adds to the last code's embedding: reply token k + 1 with its row, once that row has come;
        after the thinker finished, ``tts_text_end`` once (at k = len(reply) - 2) and then ``tts_text_pad``."""
        k = r.row.step
        i = len(r.prompt_ids) + 1 + k  # reply token k + 1's row
        if i < len(r.rows):
            return r.rows[i], r.reply[k + 1]
        if not r.text_done:
            return None
        return "end" if k == len(r.reply) - 2 else "pad"

    def step(self, rs: list[Qwen25TalkerRequest], items: list[Any]) -> list[Emit]:
        return [self._emit_code(r, code) for r, code in zip(rs, self.model.step([r.row for r in rs], items))]

    def _emit_code(self, r: Qwen25TalkerRequest, code: int) -> Emit:
        r.sampled += 1
        if code in self.model.eos:
            return Emit(finish="stop")
        finish = "length" if r.sampled >= r.max_tokens else None
        return Emit({"token_ids": [code]}, tokens=1, finish=finish)


def build_talker_engine(ctx: StageContext) -> TalkerEngine:
    return TalkerEngine(ctx)
