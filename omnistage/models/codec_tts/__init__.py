"""``codec_tts``: streamed text-to-speech with a codec-token LM and a codec decoder.

Stage 0 (llm on vLLM, output ``token_ids``) continues the family's prompt
(text + voice) with codec tokens until ``<|speech_end|>``; stage 1
(generation, output ``audio``) decodes the codes to a waveform. With async
chunk on (the default), every ``chunk_frames`` complete frames are forwarded
and decoded while the LM is still generating, so the first audio arrives
long before the sentence is finished; the streamed audio equals the codec's
decode of the whole code sequence (see ``shared/codec_lm/codec.py`` for why, and the tests
for the measured difference). This is the Llasa / Orpheus recipe.

Folder layout::

    my-tts/
      omnistage.json  {"pipeline": "codec_tts",
                       "prompt_template": "<|text_start|>{voice}{text}<|text_end|><|speech_start|>",
                       "voices": {"alto": "alto: ", ...}, "default_voice": "alto",
                       "speech_end_token": "<|speech_end|>",
                       "codec_token_offset": 389, "codebook_size": 32, "num_quantizers": 2,
                       "layout": "shared" | "per_codebook", "chunk_frames": 8,
                       "constrain_to_codec_tokens": true, "decode_context_frames": null}
      lm/             a causal-LM folder vLLM serves; its vocabulary holds the codec tokens
      codec/          a transformers codec folder: Mimi (causal, so streaming is exact) or XCodec2
                      (Llasa's; not causal, so streamed blocks approximate the whole decode: shared/codec_lm/codec.py)

Decisions:
- Codec tokens are flattened frame-major (K tokens per frame). Code ``c`` of
  codebook ``q`` is LM id ``offset + c`` (``shared``) or
  ``offset + q * codebook_size + c`` (``per_codebook``).
- The LM stage ships the token layout in-band (``codec_layout`` in its first
  output), so the edge functions stay plain functions with no folder access.
- ``chunk_frames`` comes from ``omnistage.json`` and can be overridden per
  deploy or request in stage 1's sampling params (``{"chunk_frames": 4}``).
- By default the LM samples only codec tokens and the end token
  (``allowed_token_ids``); a caller's sampling params override it.
- The codec stage keeps ``decode_context_frames`` (default: the codec's exact
  receptive field) of already-decoded codes per request and re-decodes them
  in front of each new piece; pieces of concurrent requests are right-padded
  into one batch (causal decoder: padding never reaches real samples).
- Voices are prompt prefixes listed in ``omnistage.json``; ``/v1/audio/voices``
  lists them. ``speed`` and ``instructions`` are refused (400).
- A template with ``{ref_codes}`` clones voices (Llasa): see shared/codec_lm/lm.py. ``python -m
  omnistage.testing.tiny llasa DIR`` writes such a folder.
"""

from __future__ import annotations

import json
from pathlib import Path

from omnistage.info import CodeFrames, PipelineInfo, SpeechInfo
from omnistage.models.codec_tts.tiny import build, build_llasa
from omnistage.models.shared.codec_lm.config import load_tts_config
from omnistage.models.shared.codec_lm.stages import chunk_sizes_to_codec_stage, codec_stage, speech_lm_stage
from omnistage.pipeline import Pipeline

GREEDY = {"temperature": 0.0, "repetition_penalty": 1.0}


def codec_hop(folder: Path) -> int:
    """Audio samples per codec frame, from the codec's config: Mimi names its frame rate, XCodec2 its hop."""
    from transformers import AutoConfig, MimiConfig

    cfg = AutoConfig.from_pretrained(folder)
    if isinstance(cfg, MimiConfig):
        return round(cfg.sampling_rate / cfg.frame_rate)
    return int(cfg.hop_length)


def folder_info(folder: Path, info: PipelineInfo) -> PipelineInfo:
    """What the HTTP server shows before engines start: voices, the output sample rate, how codes make frames."""
    cfg = load_tts_config(folder)
    codec_config = folder / "codec" / "config.json"
    codec = json.loads(codec_config.read_text()) if codec_config.is_file() else {}
    rate = codec.get("sampling_rate")
    hop = codec_hop(codec_config.parent) if codec else None
    frames = CodeFrames(
        codec.get("model_type", "?"),
        hop,
        cfg.num_quantizers,
        repeatable=GREEDY,
        initial_chunk_frames=cfg.initial_chunk_frames,
    )
    return info.with_speech(
        frames=frames,
        voices=cfg.voices,
        default_voice=cfg.default_voice,
        supports_voice_cloning=cfg.can_clone,
        max_ref_audio_s=float(cfg.max_ref_audio_s),
        sample_rate=int(rate) if rate else info.speaks.sample_rate,
    )


PIPELINE = Pipeline(
    name="codec_tts",
    description="codec-token LM (vLLM) streams codes to a codec decoder (text -> speech)",
    matches=None,  # selected by omnistage.json {"pipeline": "codec_tts"}
    stages=[speech_lm_stage(0), codec_stage(1, source=0)],
    # chat: False: the speech LM speaks a plain prompt, not chat messages (/v1/audio/speech serves it)
    info=PipelineInfo(chat=False, speech=SpeechInfo()),
    folder_info=folder_info,
    shape_request=chunk_sizes_to_codec_stage,
)
PIPELINES = [PIPELINE]
TINY = {"codec_tts": build, "llasa": build_llasa}
