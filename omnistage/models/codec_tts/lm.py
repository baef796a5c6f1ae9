"""The speech LM stage: the generic vLLM stage with the family's prompt format.

The text to speak is tokenized with special-token parsing off, so a user who
types ``<|speech_end|>`` or a codec token gets plain text, never control
tokens. The template parts around it (with the voice's prefix) come from the
folder's ``omnistage.json`` and keep their special tokens.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from omnistage.models.codec_tts.config import TTSConfig
from omnistage.models.codec_tts.edges import LAYOUT_KEY
from omnistage.pipeline import StageContext
from omnistage.stages.base import StageRequest
from omnistage.stages.llm.engine import LLMStageEngine, Prepared



class CodecLMEngine(LLMStageEngine):
    def __init__(self, ctx: StageContext, config: TTSConfig):
        super().__init__(ctx)
        self.config = config
        self.end_id: int | None = None

    async def start(self) -> None:
        await super().start()
        cfg = self.config
        end = self.tokenizer.convert_tokens_to_ids(cfg.speech_end_token)
        if not isinstance(end, int) or end == self.tokenizer.unk_token_id or end >= self.vocab_size:
            await self.shutdown()
            raise ValueError(f"omnistage.json: speech_end_token {cfg.speech_end_token!r} is not in the LM's vocabulary")
        last = cfg.codec_token_offset + cfg.num_codec_tokens
        if last > self.vocab_size:
            await self.shutdown()
            raise ValueError(f"omnistage.json: codec tokens {cfg.codec_token_offset}..{last - 1} exceed the LM's "
                             f"vocabulary ({self.vocab_size})")
        self.end_id = end

    def layout(self) -> dict[str, Any]:
        cfg = self.config
        return {"codec_token_offset": cfg.codec_token_offset, "codebook_size": cfg.codebook_size,
                "num_quantizers": cfg.num_quantizers, "layout": cfg.layout, "end_id": self.end_id,
                "chunk_frames": cfg.chunk_frames}

    def prompt_ids(self, inputs: dict[str, Any]) -> tuple[list[int], str]:
        """Token ids of the family's prompt around the text (+ the voice prefix), and its text form."""
        if inputs.get("prompt_token_ids") is not None or inputs.get("messages") is not None:
            raise ValueError("prompt: codec_tts speaks a text 'prompt'; prompt_token_ids and messages are not supported")
        if inputs.get("multi_modal_data"):  # e.g. a reference voice clip: not something these prompts can carry
            raise ValueError("multi_modal_data: codec_tts takes text only (voices are listed by /v1/audio/voices)")
        text = inputs.get("prompt")
        if not isinstance(text, str) or not text.strip():
            raise ValueError("prompt: the text to speak is empty")
        info = inputs.get("additional_information") or {}
        if not isinstance(info, Mapping):
            raise ValueError("additional_information: expected an object")
        if info.get("instructions") is not None:
            raise ValueError("instructions: this model does not take speaking instructions")
        speed = info.get("speed")
        if speed is not None and speed != 1.0:
            raise ValueError("speed: this model does not support changing the speed")
        voice = info.get("voice")
        if voice is not None and not isinstance(voice, str):
            raise ValueError(f"voice: expected a string, got {type(voice).__name__}")
        prefix = self.config.voice_prefix(voice)
        before, after = self.config.prompt_template.split("{text}")
        before, after = before.replace("{voice}", prefix), after.replace("{voice}", prefix)
        tok = self.tokenizer
        ids = (tok.encode(before, add_special_tokens=False)
               + tok.encode(text, add_special_tokens=False, split_special_tokens=True)
               + tok.encode(after, add_special_tokens=False))
        return ids, before + text + after

    def sampling_defaults(self, params: Any) -> Any:
        """Stop at the end token and (unless the folder says otherwise) sample only codec tokens;
        a caller's own values win. A caller's SamplingParams object is taken as it is."""
        if params is not None and not isinstance(params, Mapping):
            return params
        cfg = self.config
        defaults: dict[str, Any] = {"stop_token_ids": [self.end_id]}
        if cfg.constrain_to_codec_tokens:
            first = cfg.codec_token_offset
            defaults["allowed_token_ids"] = list(range(first, first + cfg.num_codec_tokens)) + [self.end_id]
        return {**defaults, **dict(params or {})}

    def prepare(self, req: StageRequest) -> Prepared:
        ids, text = self.prompt_ids(req.inputs)
        prep = super().prepare(replace(req, inputs={"prompt_token_ids": ids, "prompt": text},
                                       params=self.sampling_defaults(req.params)))
        prep.extra[LAYOUT_KEY] = self.layout()
        return prep


def build_lm_stage(ctx: StageContext) -> CodecLMEngine:
    from omnistage.models.codec_tts.config import load_tts_config

    if ctx.model is None:
        raise ValueError("codec_tts needs a model folder (omnistage.json + lm/ + codec/)")
    folder = Path(ctx.model)
    return CodecLMEngine(replace(ctx, model=str(folder / "lm")), load_tts_config(folder))
