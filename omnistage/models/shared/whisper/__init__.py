"""Whisper on vLLM as a recogniser stage: its prompt (prompt.py), its timestamp rules (timestamps.py) and the
stage declaration, for the ``whisper`` family and for ``speech_chat``, which hears through it."""

from __future__ import annotations

from omnistage.pipeline import StageSpec

# vLLM's "<module>:<class>" name of the timestamp rules (a string: this module imports neither torch nor vLLM)
TIMESTAMP_RULES = "omnistage.models.shared.whisper.timestamps:WhisperTimestampRules"


def recognizer_stage(stage_id: int = 0, *, output: str = "text+token_ids", final: bool = True) -> StageSpec:
    """Whisper as one encoder-decoder llm stage, greedy by default; its timestamp rules are loaded as a logits
    processor, inert unless a request asks for timestamps (extra_args), so other requests sample as before."""
    return StageSpec(
        stage_id,
        kind="llm",
        name="recognizer",
        output=output,
        can_output="text+token_ids",
        final=final,
        default_params={"temperature": 0.0},
        deploy_defaults={"engine_args": {"logits_processors": [TIMESTAMP_RULES]}},
    )
