"""``codec_tts``: streamed text-to-speech with a codec-token LM and a codec decoder.

Stage 0 (llm on vLLM, output ``token_ids``) continues the family's prompt
(text + voice) with codec tokens until ``<|speech_end|>``; stage 1
(generation, output ``audio``) decodes the codes to a waveform. With async
chunk on (the default), every ``chunk_frames`` complete frames are forwarded
and decoded while the LM is still generating, so the first audio arrives
long before the sentence is finished; the streamed audio equals the codec's
decode of the whole code sequence (see ``codec.py`` for why, and the tests
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
                      (Llasa's; not causal, so streamed blocks approximate the whole decode: codec.py)

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
- A template with ``{ref_codes}`` clones voices (Llasa): see lm.py. ``python -m
  omnistage.testing.tiny llasa DIR`` writes such a folder.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omnistage.models.codec_tts.config import folder_info
from omnistage.models.codec_tts.edges import codes_every_n_frames, whole_codes
from omnistage.models.codec_tts.tiny import build, build_llasa
from omnistage.pipeline import Edge, Pipeline, StageContext, StageSpec


def speech_lm_engine(ctx: StageContext) -> Any:
    from omnistage.models.codec_tts.lm import (
        build_lm_stage,  # vLLM: only when the stage starts
    )

    return build_lm_stage(ctx)


def codec_adapter(ctx: StageContext) -> Any:
    from omnistage.models.codec_tts.decoder import (
        CodecDecoderAdapter,  # torch + transformers: only when built
    )

    return CodecDecoderAdapter(ctx)


CODEC_STAGE_KNOBS = ("initial_codec_chunk_frames", "chunk_frames")


def chunk_sizes_to_codec_stage(prompt: dict[str, Any], params: list[Any]) -> None:
    """The pipeline's request hook: /v1/audio/speech sends the codec stage's chunk sizes in
    ``additional_information`` (the route does not know the stage layout); they become stage 1's
    params, over its deploy defaults (the codec stage validates them)."""
    info = prompt.get("additional_information")
    if not isinstance(info, Mapping) or not any(k in info for k in CODEC_STAGE_KNOBS):
        return
    rest = {k: v for k, v in info.items() if k not in CODEC_STAGE_KNOBS}
    sizes = {k: info[k] for k in CODEC_STAGE_KNOBS if info.get(k) is not None}
    prompt["additional_information"] = rest
    if isinstance(params[1], Mapping):
        params[1] = {**params[1], **sizes}


PIPELINE = Pipeline(
    name="codec_tts",
    description="codec-token LM (vLLM) streams codes to a codec decoder (text -> speech)",
    matches=None,  # selected by omnistage.json {"pipeline": "codec_tts"}
    stages=[
        StageSpec(
            0,
            kind="llm",
            name="speech_lm",
            output="token_ids",
            engine=speech_lm_engine,
            default_params={
                "temperature": 0.7,
                "top_p": 0.95,
                "repetition_penalty": 1.1,
                "max_tokens": 1024,
                "detokenize": False,
            },
        ),
        StageSpec(
            1,
            kind="generation",
            name="codec",
            output="audio",
            final=True,
            adapter=codec_adapter,
            inputs=[Edge(0, process=whole_codes, process_chunk=codes_every_n_frames)],
        ),
    ],
    # chat: False: the speech LM speaks a plain prompt, not chat messages (/v1/audio/speech serves it)
    info={"supports_speed": False, "chat": False, "supports_voice_cloning": False},
    folder_info=folder_info,
    shape_request=chunk_sizes_to_codec_stage,
)
PIPELINES = [PIPELINE]
TINY = {"codec_tts": build, "llasa": build_llasa}
