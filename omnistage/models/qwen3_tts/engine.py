"""Qwen3-TTS's talker stage: ``stages.ar.StepEngine`` over ``talker.TalkerModel``; it emits one ``token_ids``
row [G codes] per frame (an in-context clone's first output also carries ``ref_codes``).

Inputs: the prompt's ``prompt`` (the text to speak) and the request's ``SpeechInput`` with
``voice`` (CustomVoice: a preset, matched case-insensitively), ``instructions`` (VoiceDesign,
and CustomVoice 1.7B), ``language`` (``Auto`` by default; a dialect speaker speaking Chinese or ``Auto``
uses its dialect), ``ref_audio`` (``(samples, rate)``) + ``ref_text`` or ``x_vector_only_mode`` (Base), and
``non_streaming_mode`` (the package's switch between the whole text in the prompt — its default for
CustomVoice / VoiceDesign — and the text trailing one token per frame — its default for clones).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.qwen3_tts.config import (
    SAMPLE_RATE,
    Checkpoint,
    TalkerParams,
    checkpoint_defaults,
    parse_params,
    read_checkpoint,
)
from omnistage.models.qwen3_tts.talker import TalkerModel, TTSRow
from omnistage.models.shared.folder_engine import FolderStepEngine
from omnistage.pipeline import StageContext
from omnistage.speech import SpeechInput
from omnistage.stages.ar.engine import ARRequest, Emit
from omnistage.stages.ar.kv import RequestKV
from omnistage.stages.ar.sampling import request_generator
from omnistage.stages.base import StageRequest

MIN_REF_SAMPLES = 2400  # 0.1 s at 24 kHz (the speaker encoder's STFT window is 1024 samples)


@dataclass
class Spoken:
    """What one request asks the talker to say, checked (tokenized on the event loop; audio work at prefill)."""

    ids: list[int]
    instruct_ids: list[int] | None = None
    language: str = "auto"
    speaker: str | None = None  # a preset (lower case)
    ref_audio: np.ndarray | None = None  # mono float32 at 24 kHz
    ref_ids: list[int] | None = None  # None: x-vector only
    non_streaming: bool = True


@dataclass
class TTSRequest(ARRequest):
    spoken: Spoken | None = None
    params: TalkerParams | None = None
    row: TTSRow | None = None
    extras: dict[str, Any] = field(default_factory=dict)


class Bundle:
    """The talker stage's models: the talker, the text tokenizer, and for Base the clone front end."""

    def __init__(self, folder: Path, device: str, dtype: torch.dtype, checkpoint: Checkpoint):
        from transformers import Qwen2TokenizerFast

        self.talker = TalkerModel(folder, device, dtype)
        self.tokenizer = Qwen2TokenizerFast.from_pretrained(str(folder))
        self.codes = self.xvector = None
        if checkpoint.model_type == "base":
            from omnistage.models.qwen3_tts.speech_encoder import MimiEncoder, XVectorExtractor

            self.codes = MimiEncoder(folder / "speech_tokenizer", device, dtype)
            self.xvector = XVectorExtractor(folder, device, dtype)

    def tokens(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])


def _clip(value: Any) -> np.ndarray:
    """``(samples, sample_rate)`` -> mono float32 at 24 kHz."""
    from omnistage.media_intake import mono, resample

    if not (isinstance(value, (tuple, list)) and len(value) == 2):
        raise InvalidRequestError("ref_audio", "expected (samples, sample_rate)")
    samples, sr = value
    try:
        audio = np.asarray(samples, dtype=np.float32)
    except (TypeError, ValueError):
        raise InvalidRequestError("ref_audio", "samples must be a sequence of numbers") from None
    if audio.ndim == 2:
        audio = mono(audio)
    if audio.ndim != 1 or audio.size == 0 or isinstance(sr, bool) or not isinstance(sr, int) or sr <= 0:
        raise InvalidRequestError("ref_audio", "expected non-empty mono samples and a positive integer sample rate")
    if not np.isfinite(audio).all():
        raise InvalidRequestError("ref_audio", "samples must be finite")
    audio = resample(audio, sr, SAMPLE_RATE)  # once, soxr HQ, as every input (media_intake)
    if audio.size < MIN_REF_SAMPLES:  # the speaker encoder's STFT needs a window's worth of samples
        raise InvalidRequestError(
            "ref_audio",
            f"the clip is {audio.size / SAMPLE_RATE:.3f} s long; at least "
            f"{MIN_REF_SAMPLES / SAMPLE_RATE:.2f} s is needed",
        )
    return audio


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequestError(name, "expected non-empty text")
    return value


def request_spoken(text: Any, speech: SpeechInput | None, ck: Checkpoint, tokens: Any) -> Spoken:
    """Check a request's text and speech input against the checkpoint (every problem a 400 naming its field)."""
    text = _text(text, "prompt")
    info = speech or SpeechInput()
    kind = ck.model_type
    spoken = Spoken(tokens(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"))
    language = info.language or "auto"
    if not isinstance(language, str) or language.lower() not in ck.public_languages:
        raise InvalidRequestError(
            "language", f"{language!r} is not one of {', '.join(ck.public_languages)} (case-insensitive)"
        )
    spoken.language = language.lower()
    voice = info.voice
    if kind == "custom_voice":
        voice = voice if voice is not None else sorted(ck.speakers)[0]
        if not isinstance(voice, str) or voice.lower() not in ck.speakers:
            raise InvalidRequestError(
                "voice",
                f"{voice!r} is not one of this model's voices: {', '.join(sorted(ck.speakers))} (case-insensitive)",
            )
        spoken.speaker = voice.lower()
    elif voice is not None:
        raise InvalidRequestError(
            "voice",
            f"this Qwen3-TTS {kind} checkpoint has no preset voices"
            + (" (clone one with ref_audio)" if kind == "base" else " (describe one in instructions)"),
        )
    instructions = info.instructions
    if instructions is not None and instructions != "":
        if not ck.takes_instructions:
            raise InvalidRequestError(
                "instructions", f"this Qwen3-TTS {kind} ({ck.model_size}) checkpoint takes no instructions"
            )
        spoken.instruct_ids = tokens(f"<|im_start|>user\n{_text(instructions, 'instructions')}<|im_end|>\n")
    ref_audio, ref_text = info.ref_audio, info.ref_text
    x_only = bool(info.x_vector_only_mode)
    if kind == "base":
        if ref_audio is None:
            raise InvalidRequestError(
                "ref_audio",
                "Qwen3-TTS Base clones a voice: give ref_audio with its ref_text "
                "(or x_vector_only_mode), or a registered voice",
            )
        spoken.ref_audio = _clip(ref_audio)
        if not x_only:
            if ref_text is None or ref_text == "":
                raise InvalidRequestError(
                    "ref_text", "the transcript of ref_audio is needed to clone in context (or set x_vector_only_mode)"
                )
            spoken.ref_ids = tokens(f"<|im_start|>assistant\n{_text(ref_text, 'ref_text')}<|im_end|>\n")
    elif ref_audio is not None or x_only:
        raise InvalidRequestError(
            "ref_audio" if ref_audio is not None else "x_vector_only_mode",
            f"this Qwen3-TTS {kind} checkpoint cannot clone voices (a Base checkpoint does)",
        )
    elif ref_text is not None:
        raise InvalidRequestError("ref_text", "given without ref_audio")
    spoken.non_streaming = info.non_streaming_mode if info.non_streaming_mode is not None else kind != "base"
    return spoken


class Qwen3TTSEngine(FolderStepEngine):
    family = "qwen3_tts"
    read_defaults = checkpoint_defaults

    def __init__(self, ctx: StageContext):
        super().__init__(ctx)
        self.checkpoint = read_checkpoint(self.folder)

    def load_model(self) -> Bundle:
        return Bundle(self.folder, *self.device_and_dtype(), self.checkpoint)

    def new_request(self, req: StageRequest) -> TTSRequest:
        params = parse_params(self.whole_input(req).params, self.defaults)
        spoken = request_spoken((req.inputs or {}).get("prompt"), req.speech, self.checkpoint, self.model.tokens)
        generator = request_generator(max(params.talker.temperature, params.sub.temperature), params.seed)
        row = TTSRow(
            RequestKV(self.model.talker.num_layers),
            params.talker,
            params.sub,
            params.repetition_penalty,
            generator,
            min_tokens=params.min_tokens,
        )
        return TTSRequest(req, spoken=spoken, params=params, row=row)

    def _prompt(self, r: TTSRequest) -> torch.Tensor:
        m, ck, s = self.model.talker, self.checkpoint, r.spoken
        language_id = None if s.language == "auto" else ck.languages[s.language]
        speaker = ref_codes = None
        if s.speaker is not None:
            speaker = m.codec([ck.speakers[s.speaker]])[0]
            dialect = ck.dialects.get(s.speaker)
            if dialect and s.language in ("chinese", "auto"):
                language_id = ck.languages[str(dialect).lower()]
        if s.ref_audio is not None:
            speaker = self.model.xvector(s.ref_audio)
            if s.ref_ids is not None:
                ref_codes = self.model.codes.encode(s.ref_audio)
                r.extras["ref_codes"] = ref_codes
        embeds, r.row.trailing = m.prompt(
            s.ids,
            instruct_ids=s.instruct_ids,
            language_id=language_id,
            speaker=speaker,
            non_streaming=s.non_streaming,
            ref_ids=s.ref_ids,
            ref_codes=ref_codes,
        )
        limit = m.max_positions
        if embeds.shape[0] + r.params.max_tokens > limit:  # RoPE would run past what the model was trained on
            raise InvalidRequestError(
                "max_tokens",
                f"the prompt ({embeds.shape[0]} positions) plus max_tokens "
                f"({r.params.max_tokens}) exceed the model's {limit}",
            )
        return embeds

    def prefill_batch(self, rs: list[TTSRequest]) -> list[Emit | Exception]:
        out: list[Emit | Exception] = [Emit()] * len(rs)
        ok, embeds = [], []
        for i, r in enumerate(rs):
            try:
                with torch.no_grad():
                    embeds.append(self._prompt(r))
                ok.append(i)
            except Exception as e:  # this request fails alone
                out[i] = e
        if ok:
            self.model.talker.prefill_batch([rs[i].row for i in ok], embeds)
        for i in ok:
            r = rs[i]
            ref = r.extras.get("ref_codes")
            out[i] = Emit(
                {"ref_codes": ref} if ref is not None else None, finish="length" if r.params.max_tokens <= 1 else None
            )  # N tokens make N - 1 frames
        return out

    def step(self, rs: list[TTSRequest], items: list[Any]) -> list[Emit]:
        m = self.model.talker
        frames = m.frames([r.row for r in rs])
        emits: list[Emit] = []
        going: list[int] = []
        for i, r in enumerate(rs):
            # N tokens make N - 1 frames: the last token's frame is never completed, so it is not drawn
            done = len(r.row.history) + 1 >= r.params.max_tokens
            emits.append(
                Emit({"token_ids": frames[i].unsqueeze(0).clone()}, tokens=1, finish="length" if done else None)
            )
            if not done:
                going.append(i)
        if going:
            m.advance([rs[i].row for i in going], frames[going])
            for i in going:
                if rs[i].row.code0 == m.codec_eos:  # the end of speech: its frame is not audio
                    emits[i].finish = "stop"
        return emits


def build_talker_engine(ctx: StageContext) -> Qwen3TTSEngine:
    return Qwen3TTSEngine(ctx)
