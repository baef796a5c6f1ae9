"""The talker stage: omnistage's step-batched autoregressive engine (``stages.ar``) over transformers' talker.

Why not vLLM: each talker step's input is the sum of the previous frame's G codec
embeddings — G-1 of them drawn by the code predictor, a second autoregressive model
run inside the step — plus the projected thinker text for that step, which streams
in from the thinker. vLLM's public API conditions a request only through its prompt
(ids, embeddings, multimodal data); nothing public feeds a running request a new
input embedding per step or runs a nested model between steps.

The loop (the diffusion engine's rhythm): requests join at step boundaries (one
prefill each, once the thinker's first reply token has arrived), then every step
runs one batched forward for all requests whose next text item is known (the
code predictor and the talker, each over the whole batch), emits each request's
completed frame as a ``token_ids`` row [G codes] and samples the next codebook-0
code. A request ends at ``codec_eos`` or after ``max_tokens`` codebook-0 codes
(as transformers' ``talker_max_new_tokens``: the last code drawn starts no
frame). A request waits (without holding the batch) while the thinker has not yet
produced the text its next step reads. The loop, admission and threading are
``stages.ar.engine.StepEngine``'s; this module fills in its hooks.

Inputs (``feed`` chunks, or all at once without async chunk; ``edges.py``):
``prompt_token_ids`` (first), ``token_ids`` (reply tokens as they come, ``reply_continues`` when more follow),
``speaker``, and for a media prompt ``media`` (the thinker's hidden states at the media positions and the media
grids; a request with media waits for it before its prefill).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omnistage.models.qwen_omni.config import load_omni_config
from omnistage.models.shared.folder_engine import FolderStepEngine
from omnistage.models.shared.omni.sampling import TALKER_PARAM_KEYS, talker_sampling
from omnistage.pipeline import StageContext
from omnistage.stages.ar.engine import ARRequest, Emit
from omnistage.stages.ar.kv import RequestKV
from omnistage.stages.base import StageRequest

PARAM_KEYS = TALKER_PARAM_KEYS


@dataclass
class Qwen3TalkerRequest(ARRequest):
    prompt_ids: list[int] | None = None
    reply: list[int] = field(default_factory=list)  # thinker reply tokens so far
    fed: int = 0  # of them, how many the thinker said more tokens follow (so they are fed back to it)
    text_done: bool = False  # the thinker finished (its last chunk arrived)
    speaker: str | None = None
    media: dict[str, Any] | None = None  # the thinker's hidden states at media positions + grids (thinker.py)
    row: Any = None  # talker_model.Qwen3TalkerRow
    max_tokens: int = 0
    step: int = 0  # generation_step: which trailing text item the next step reads
    sampled: int = 0  # codebook-0 codes drawn


class TalkerEngine(FolderStepEngine):
    """``stages.ar.StepEngine`` over ``talker_model.TalkerModel``: a request prefills once the thinker's
    turn has 4 tokens, and takes part in a step once the text that step reads has arrived."""

    family = "qwen_omni"

    def __init__(self, ctx: StageContext):
        super().__init__(ctx)
        self.config = load_omni_config(self.folder)

    def load_model(self) -> Any:
        from omnistage.models.qwen_omni.talker_model import TalkerModel

        return TalkerModel(self.folder, *self.device_and_dtype())

    # ------------------------------------------------------------------ requests

    def new_request(self, req: StageRequest) -> Qwen3TalkerRequest:
        from omnistage.models.qwen_omni.talker_model import Qwen3TalkerRow

        sampling, max_tokens, speaker = talker_sampling(req.params, self.config.sampling_defaults("talker"))
        r = Qwen3TalkerRequest(
            req, max_tokens=max_tokens, speaker=speaker, row=Qwen3TalkerRow(RequestKV(self.model.num_layers), sampling)
        )
        self._add(r, req.inputs or {}, last=not req.stream_inputs)
        return r

    def _add(self, r: Qwen3TalkerRequest, chunk: Mapping[str, Any], last: bool) -> None:
        if chunk.get("prompt_token_ids") is not None:
            r.prompt_ids = [int(t) for t in chunk["prompt_token_ids"]]
        if chunk.get("speaker") is not None and r.speaker is None:
            r.speaker = chunk["speaker"]
        if chunk.get("media") is not None:
            r.media = chunk["media"]
        if chunk.get("token_ids") is not None:
            r.reply.extend(int(t) for t in chunk["token_ids"])
            if chunk.get("reply_continues"):
                r.fed = len(r.reply)
        if last:
            r.text_done = True

    def add_input(self, r: Qwen3TalkerRequest, chunk: Mapping[str, Any], last: bool) -> None:
        if r.text_done:
            raise ValueError(f"stage {self.stage_id}: input fed to {r.request_id!r} after its last chunk")
        self._add(r, chunk, last)

    # ------------------------------------------------------------------ text

    def _visible(self, r: Qwen3TalkerRequest) -> list[int]:
        """The assistant turn as transformers' talker sees it: the prompt's part of the turn and the reply
        without its last token (generate() gathers the thinker's input embeddings per forward, and the last
        token drawn is never fed back). Until the thinker finished, a token may be the last unless the thinker
        said more follow (``reply_continues``, thinker.py); otherwise the talker reads it once the next exists."""
        cfg = self.model.config
        start = self.model.assistant_start(r.prompt_ids, cfg.im_start_token_id, cfg.assistant_token_id)
        return r.prompt_ids[start:] + r.reply[: max(len(r.reply) - 1, r.fed)]

    def _head(self, r: Qwen3TalkerRequest) -> list[int] | None:
        """The assistant turn's first 4 tokens, once known."""
        turn = self._visible(r)
        return turn[:4] if len(turn) >= 4 else None

    def _text_item(self, r: Qwen3TalkerRequest) -> int | str | None:
        """The trailing text the next step reads (None: not known yet): the turn's tokens from the 5th on,
        then ``tts_eos``, then ``tts_pad``; as transformers does, ``tts_eos`` also goes at (and ``tts_pad``
        after) the index of the reply's first end-of-turn token."""
        from omnistage.models.qwen_omni.talker_model import EOS_TEXT, PAD_TEXT

        end = self.model.config.im_end_token_id
        j = r.step
        if end in r.reply and j >= r.reply.index(end):
            return EOS_TEXT if j == r.reply.index(end) else PAD_TEXT
        turn = self._visible(r)
        if 4 + j < len(turn):
            return turn[4 + j]
        if not r.text_done:
            return None
        return EOS_TEXT if 4 + j == len(turn) else PAD_TEXT

    # ------------------------------------------------------------------ hooks

    def prefill_ready(self, r: Qwen3TalkerRequest) -> bool:
        """Once the prompt and the turn's head are known, or the thinker ended (prefill then fails or stops)."""
        if r.text_done:
            return True
        if r.prompt_ids is not None and r.media is None and self.config.media_token_ids.intersection(r.prompt_ids):
            return False  # a media prompt: the thinker's hidden states come after its first tokens
        try:
            return r.prompt_ids is not None and self._head(r) is not None
        except ValueError:
            return True  # the prompt has no assistant turn: prefill reports it

    def prefill(self, r: Qwen3TalkerRequest) -> Emit:
        (emit,) = self.prefill_batch([r])
        if isinstance(emit, Exception):
            raise emit
        return emit

    def _prefill_input(self, r: Qwen3TalkerRequest) -> tuple[Any, Any, int] | None:
        """(embeds, positions, rope delta) of ``r``'s prefill; None: the thinker ended before its turn had 4 tokens
        (nothing to say)."""
        if r.prompt_ids is None:
            raise ValueError("the talker got no thinker prompt (prompt_token_ids)")
        head = self._head(r)
        if head is None:
            return None
        return self.model.prefill_input(r.prompt_ids, head, self.config.speaker_id(r.speaker), r.media)

    def prefill_batch(self, rs: list[Qwen3TalkerRequest]) -> list[Emit | Exception]:
        """The joining requests' prefills as batched forwards (a bad input fails its request alone): requests of
        similar prompt lengths share one forward, shortest first (padding a short prompt to a long one would
        cost every row the long one's compute)."""
        out: list[Emit | Exception | None] = [None] * len(rs)
        todo: list[tuple[int, tuple[Any, Any, int]]] = []
        for i, r in enumerate(rs):
            try:
                x = self._prefill_input(r)
            except Exception as e:  # this request fails alone
                out[i] = e
                continue
            if x is None:
                out[i] = Emit(finish="stop")
            else:
                todo.append((i, x))
        for group in _similar_lengths(sorted(todo, key=lambda item: item[1][0].shape[0])):
            try:
                self.model.prefill_batch([rs[i].row for i, _ in group], [x for _, x in group])
            except Exception as e:  # this forward's requests fail; the other groups' prefills stand
                for i, _ in group:
                    out[i] = e
                continue
            for i, _ in group:
                rs[i].sampled = 1
                out[i] = Emit(finish=self._finish_reason(rs[i]))
        return out

    def ready(self, r: Qwen3TalkerRequest) -> int | str | None:
        return self._text_item(r)

    def step(self, rs: list[Qwen3TalkerRequest], items: list[Any]) -> list[Emit]:
        frames = self.model.step([r.row for r in rs], items)
        emits = []
        for i, r in enumerate(rs):
            r.step += 1
            r.sampled += 1
            emits.append(Emit({"token_ids": frames[i : i + 1].clone()}, tokens=1, finish=self._finish_reason(r)))
        return emits

    def _finish_reason(self, r: Qwen3TalkerRequest) -> str | None:
        """After a codebook-0 code was drawn: ``codec_eos`` ends the speech; so does the ``max_tokens``-th
        code (as transformers' ``talker_max_new_tokens``: the last code drawn starts no frame)."""
        if r.row.code0 == self.model.codec_eos:
            return "stop"
        return "length" if r.sampled >= r.max_tokens else None


def _similar_lengths(todo: list[tuple[int, Any]], slack: int = 32) -> list[list[tuple[int, Any]]]:
    """Prefill inputs sorted by length -> groups whose longest is at most twice (plus ``slack`` tokens) their
    shortest."""
    groups: list[list[tuple[int, Any]]] = []
    for item in todo:
        if groups and item[1][0].shape[0] <= 2 * groups[-1][0][1][0].shape[0] + slack:
            groups[-1].append(item)
        else:
            groups.append([item])
    return groups


def build_talker_engine(ctx: StageContext) -> TalkerEngine:
    return TalkerEngine(ctx)
