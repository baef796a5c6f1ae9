"""The speech LM stage: the generic vLLM stage with the family's prompt format.

The text to speak is tokenized with special-token parsing off, so a user who
types ``<|speech_end|>`` or a codec token gets plain text, never control
tokens. The template parts around it (with the voice's prefix) come from the
folder's ``omnistage.json`` and keep their special tokens.

Voice cloning (the Llasa recipe), for folders whose template has
``{ref_codes}``: the request's ``SpeechInput`` carries ``ref_audio`` (``(float
array, sample_rate)``) with ``ref_text`` (the clip's transcript). The clip is resampled to the codec's rate
(once, soxr HQ: omnistage/media_intake.py)
and encoded with the codec's own encoder (loaded in this stage only for
this; encoded clips are cached by content, so a registered voice is encoded
once per replica). The transcript goes in front of the text, the codes at
``{ref_codes}`` as codec tokens, and the codes travel on to the codec stage,
which decodes them in front of the speech.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from omnistage.errors import InvalidRequestError
from omnistage.llm_params import LLMSamplingParams
from omnistage.models.shared.codec_lm.config import TTSConfig, lookahead_frames
from omnistage.models.shared.codec_lm.edges import LAYOUT_KEY
from omnistage.models.shared.speech_request import text_to_speak
from omnistage.pipeline import StageContext
from omnistage.speech import SpeechInput
from omnistage.stages.base import StageOutput, StageRequest
from omnistage.stages.llm.engine import LLMStageEngine, Prepared

# the reference clip's codes, encoded by generate() for prepare() (within this stage: they never cross processes)
REF_CODES_KEY = "ref_codes"
REF_CACHE_SIZE = 64  # encoded reference clips kept per replica (registered voices are re-sent every request)


class CodecLMEngine(LLMStageEngine):
    def __init__(self, ctx: StageContext, config: TTSConfig, folder: Path):
        super().__init__(ctx)
        self.config = config
        self.folder = folder
        self.end_id: int | None = None
        self.encoder: Any = None  # the codec, for encoding reference clips (folders that clone only)
        self.lookahead = 0
        self._ref_cache: OrderedDict[str, list[list[int]]] = OrderedDict()

    async def start(self) -> None:
        from omnistage.models.shared.codec_lm.codec import codec_type, load_codec

        self.lookahead = lookahead_frames(self.config, codec_type(self.folder / "codec"))
        await super().start()
        cfg = self.config
        end = self.tokenizer.convert_tokens_to_ids(cfg.speech_end_token)
        if not isinstance(end, int) or end == self.tokenizer.unk_token_id or end >= self.vocab_size:
            await self.shutdown()
            raise ValueError(f"omnistage.json: speech_end_token {cfg.speech_end_token!r} is not in the LM's vocabulary")
        last = cfg.codec_token_offset + cfg.num_codec_tokens
        if last > self.vocab_size:
            await self.shutdown()
            raise ValueError(
                f"omnistage.json: codec tokens {cfg.codec_token_offset}..{last - 1} exceed the LM's "
                f"vocabulary ({self.vocab_size})"
            )
        self.end_id = end
        if cfg.can_clone:
            import torch

            devices = self.ctx.devices
            device = f"cuda:{devices[0]}" if devices and torch.cuda.is_available() else "cpu"
            self.encoder = await asyncio.to_thread(load_codec, self.folder / "codec", device)

    def layout(self) -> dict[str, Any]:
        cfg = self.config
        return {
            "codec_token_offset": cfg.codec_token_offset,
            "codebook_size": cfg.codebook_size,
            "num_quantizers": cfg.num_quantizers,
            "layout": cfg.layout,
            "end_id": self.end_id,
            "chunk_frames": cfg.chunk_frames,
            "initial_chunk_frames": cfg.initial_chunk_frames,
            "lookahead_frames": self.lookahead,
        }

    # ------------------------------------------------------------------ reference clips

    async def generate(self, req: StageRequest) -> AsyncIterator[StageOutput]:
        if req.speech is not None and req.speech.ref_audio is not None:
            # encoded here (async, cached) so prepare() finds the codes ready: [K, frames] ints
            codes = await self.reference_codes(req.speech.ref_audio)
            req = replace(req, inputs={**req.inputs, REF_CODES_KEY: codes})
        async for out in super().generate(req):
            yield out

    async def reference_codes(self, ref_audio: Any) -> list[list[int]]:
        """A reference clip ``(samples, sample_rate)`` -> its codes [K, frames] (cached by content)."""
        if self.encoder is None:
            raise InvalidRequestError(
                "ref_audio",
                "this model cannot clone voices (its prompt_template has no "
                "{ref_codes}); use one of the voices listed by /v1/audio/voices",
            )
        if not isinstance(ref_audio, (tuple, list)) or len(ref_audio) != 2:
            raise InvalidRequestError("ref_audio", "expected (samples, sample_rate)")
        samples, rate = ref_audio
        if isinstance(rate, bool) or not isinstance(rate, (int, np.integer)) or rate < 1:
            raise InvalidRequestError("ref_audio", f"sample rate must be a positive integer, got {rate!r}")
        try:
            audio = np.asarray(samples, dtype=np.float32).reshape(-1)
        except (TypeError, ValueError):
            raise InvalidRequestError("ref_audio", "samples must be a sequence of numbers") from None
        if audio.size == 0 or not np.isfinite(audio).all():
            raise InvalidRequestError("ref_audio", "the clip is empty or has non-finite samples")
        seconds = audio.size / int(rate)
        if seconds > self.config.max_ref_audio_s:
            raise InvalidRequestError(
                "ref_audio", f"the clip is {seconds:.1f} s long; at most {self.config.max_ref_audio_s:g} s is accepted"
            )
        key = hashlib.sha256(audio.tobytes() + int(rate).to_bytes(8, "little")).hexdigest()
        codes = self._ref_cache.get(key)
        if codes is None:
            codes = await asyncio.to_thread(self._encode, audio, int(rate))
            self._ref_cache[key] = codes
            while len(self._ref_cache) > REF_CACHE_SIZE:
                self._ref_cache.popitem(last=False)
        self._ref_cache.move_to_end(key)
        return codes

    def _encode(self, audio: np.ndarray, rate: int) -> list[list[int]]:
        from omnistage.media_intake import resample

        codes = self.encoder.encode(resample(audio, rate, self.encoder.sample_rate))
        if codes.shape[1] == 0:
            raise InvalidRequestError("ref_audio", "the clip is shorter than one codec frame")
        return codes.tolist()

    def _ref_codes(self, codes: Any) -> list[list[int]]:
        cfg = self.config
        k, size = cfg.num_quantizers, cfg.codebook_size
        ok = (
            isinstance(codes, (list, tuple))
            and len(codes) == k
            and all(isinstance(r, (list, tuple)) for r in codes)
            and len({len(r) for r in codes}) == 1
            and len(codes[0]) > 0
            and all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c < size for r in codes for c in r)
        )
        if not ok:
            raise InvalidRequestError(
                "ref_codes", f"expected {k} equally long non-empty lists of codes in 0..{size - 1}"
            )
        return [list(r) for r in codes]

    # ------------------------------------------------------------------ prompt

    def prompt_ids(
        self, inputs: dict[str, Any], speech: SpeechInput | None
    ) -> tuple[list[int], str, list[list[int]] | None]:
        """Token ids of the family's prompt around the text (+ the voice prefix or a cloned voice's
        transcript and codes), its text form (codes shown as ``{ref_codes}``), and the reference codes."""
        if inputs.get("prompt_token_ids") is not None or inputs.get("messages") is not None:
            raise InvalidRequestError(
                "prompt", "codec_tts speaks a text 'prompt'; prompt_token_ids and messages are not supported"
            )
        if inputs.get("multi_modal_data"):  # a reference voice clip goes in the speech input's ref_audio
            raise InvalidRequestError(
                "multi_modal_data",
                "codec_tts takes text only (a reference clip for voice cloning goes in the speech input's ref_audio)",
            )
        text = text_to_speak(inputs.get("prompt"))
        info = speech or SpeechInput()
        if info.instructions is not None:
            raise InvalidRequestError("instructions", "this model does not take speaking instructions")
        speed = info.speed
        if speed is not None and speed != 1.0:
            raise InvalidRequestError("speed", "this model does not support changing the speed")
        language = info.language
        if language is not None and language.lower() != "auto":
            raise InvalidRequestError("language", "this model speaks the language of the text; only 'auto' is accepted")
        voice = info.voice
        cfg = self.config
        ref_codes, ref_text = inputs.get(REF_CODES_KEY), info.ref_text
        if ref_codes is not None:
            if not cfg.can_clone:
                raise InvalidRequestError(
                    "ref_audio",
                    "this model cannot clone voices (its prompt_template has no "
                    "{ref_codes}); use one of the voices listed by /v1/audio/voices",
                )
            if voice is not None:
                raise InvalidRequestError("voice", "give a voice or a reference clip (ref_audio), not both")
            if ref_text is None or not ref_text.strip():
                raise InvalidRequestError("ref_text", "the transcript of the reference clip is required with ref_audio")
            ref_codes = self._ref_codes(ref_codes)
            text = ref_text + cfg.ref_text_separator + text
            prefix = ""
        else:
            if ref_text is not None:
                raise InvalidRequestError(
                    "ref_text", "ref_text is the transcript of a reference clip; ref_audio is missing"
                )
            try:
                prefix = cfg.voice_prefix(voice)
            except ValueError as e:
                raise InvalidRequestError("voice", str(e).removeprefix("voice: ")) from None
        before, after = cfg.prompt_template.split("{text}")
        before, after = before.replace("{voice}", prefix), after.replace("{voice}", prefix)
        tok = self.tokenizer
        codec_ids = self._codec_ids(ref_codes) if ref_codes is not None else []

        def literal(part: str) -> tuple[list[int], str]:
            if "{ref_codes}" not in part:
                return tok.encode(part, add_special_tokens=False), part
            a, b = part.split("{ref_codes}")
            return (
                tok.encode(a, add_special_tokens=False) + codec_ids + tok.encode(b, add_special_tokens=False),
                part if ref_codes is not None else a + b,
            )

        (ids_before, text_before), (ids_after, text_after) = literal(before), literal(after)
        ids = ids_before + tok.encode(text, add_special_tokens=False, split_special_tokens=True) + ids_after
        return ids, text_before + text + text_after, ref_codes

    def _codec_ids(self, codes: list[list[int]]) -> list[int]:
        """Codes [K, n] as the LM's codec tokens, frame-major (as the LM generates them)."""
        cfg = self.config
        per = cfg.layout == "per_codebook"
        return [
            cfg.codec_token_offset + (q * cfg.codebook_size if per else 0) + codes[q][t]
            for t in range(len(codes[0]))
            for q in range(cfg.num_quantizers)
        ]

    def sampling_defaults(self, params: Any) -> Any:
        """Stop at the end token and (unless the folder says otherwise) sample only codec tokens;
        a caller's own values win. A caller's SamplingParams object is taken as it is."""
        if params is not None and not isinstance(params, (Mapping, LLMSamplingParams)):
            return params
        cfg = self.config
        defaults: dict[str, Any] = {"stop_token_ids": [self.end_id]}
        if cfg.constrain_to_codec_tokens:
            first = cfg.codec_token_offset
            defaults["allowed_token_ids"] = list(range(first, first + cfg.num_codec_tokens)) + [self.end_id]
        return LLMSamplingParams.from_any(params).under(defaults)

    def prepare(self, req: StageRequest) -> Prepared:
        ids, text, ref_codes = self.prompt_ids(req.inputs, req.speech)
        prep = super().prepare(
            replace(req, inputs={"prompt_token_ids": ids, "prompt": text}, params=self.sampling_defaults(req.params))
        )
        prep.extra[LAYOUT_KEY] = {**self.layout(), "context_codes": ref_codes}
        return prep


def build_lm_stage(ctx: StageContext) -> CodecLMEngine:
    from omnistage.models.shared.codec_lm.config import load_tts_config

    if ctx.model is None:
        raise ValueError("codec_tts needs a model folder (omnistage.json + lm/ + codec/)")
    folder = Path(ctx.model)
    return CodecLMEngine(replace(ctx, model=str(folder / "lm")), load_tts_config(folder), folder)
