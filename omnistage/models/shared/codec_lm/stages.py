"""The two stages of a codec-token speech pipeline, declared once for every family that speaks through them, and
the request hook that hands a speech request's chunk sizes to the codec stage."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from omnistage.models.shared.codec_lm.edges import codes_every_n_frames, whole_codes
from omnistage.pipeline import Edge, StageSpec, lazy
from omnistage.speech import SpeechInput

CODEC_STAGE_KNOBS = ("initial_codec_chunk_frames", "chunk_frames")
SPEECH_LM_DEFAULTS = {"temperature": 0.7, "top_p": 0.95, "repetition_penalty": 1.1, "max_tokens": 1024}


def speech_lm_stage(stage_id: int, inputs: list[Edge] | None = None) -> StageSpec:
    """The codec-token LM on vLLM (text in, codec token ids out)."""
    return StageSpec(
        stage_id,
        kind="llm",
        name="speech_lm",
        output="token_ids",
        engine=lazy("omnistage.models.shared.codec_lm.lm:build_lm_stage"),
        default_params={**SPEECH_LM_DEFAULTS, "detokenize": False},
        inputs=inputs or [],
    )


def codec_stage(stage_id: int, source: int) -> StageSpec:
    """The codec decoder, fed the LM's codes as they stream (whole, when async chunk is off)."""
    return StageSpec(
        stage_id,
        kind="generation",
        name="codec",
        output="audio",
        final=True,
        adapter=lazy("omnistage.models.shared.codec_lm.decoder:CodecDecoderAdapter"),
        inputs=[Edge(source, process=whole_codes, process_chunk=codes_every_n_frames)],
    )


def chunk_sizes_to_codec_stage(prompt: dict[str, Any], params: list[Any]) -> None:
    """A request hook: /v1/audio/speech sends the codec stage's chunk sizes in the speech input (the route does
    not know the stage layout); they become stage 1's params, over its deploy defaults (the codec stage
    validates them)."""
    speech: SpeechInput | None = prompt.get("speech")
    if speech is None:
        return
    sizes = {k: getattr(speech, k) for k in CODEC_STAGE_KNOBS if getattr(speech, k) is not None}
    if not sizes:
        return
    prompt["speech"] = msgspec.structs.replace(speech, **dict.fromkeys(CODEC_STAGE_KNOBS))
    if isinstance(params[1], Mapping):
        params[1] = {**params[1], **sizes}
