"""``vibevoice``: Microsoft's VibeVoice (transformers ``VibeVoiceForConditionalGeneration`` + its acoustic
tokenizer) — multi-speaker scripts to 24 kHz speech, streamed frame by frame.

Resolved from ``config.json`` (``architectures: ["VibeVoiceForConditionalGeneration"]``). One ``ar`` stage
``speech`` (omnistage's step-batched AR engine over the transformers modules, ``engine.py``; why not vLLM: the
next input of each step is a latent drawn by a diffusion head and re-encoded from the decoded audio, which
vLLM's public API has no place for): each step picks a token greedily (transformers' VibeVoice has no
sampling); a speech token's latent comes from the diffusion head (classifier-free guidance against an
unconditional branch) and is decoded by the acoustic tokenizer's causal decoder with its streaming cache at
once, so every frame's audio is emitted as soon as it exists and the stream equals the whole answer.

- Input: a script, ``Speaker N: ...`` lines (text without one is speaker 1), spoken through the checkpoint's
  chat template (one turn per line, the speaker id as the role). Voice prompt: ``ref_audio`` (or a registered
  voice, /v1/audio/voices) is the script's first speaker's voice clip, through the checkpoint's processor as
  transformers' ``VibeVoiceProcessor`` takes a voice sample (its transcript is not needed); the other speakers
  speak without one. No preset voices: ``voice`` naming none registered is a 400.
- Params: ``max_tokens`` (LM steps, as transformers' ``max_new_tokens``), ``seed`` (the diffusion head's noise:
  equal to ``torch.manual_seed(seed)`` before transformers' ``generate``), ``guidance_scale``,
  ``num_diffusion_steps`` (over HTTP in ``sampling_params_list``; ``seed`` and ``max_tokens`` also top-level);
  defaults from ``generation_config.json``. ``temperature`` other than 0 is a 400.
- Chat: ``/v1/chat/completions`` with ``modalities: ["audio"]`` speaks the last user message (as qwen3_tts).

Tiny fixture: ``python -m omnistage.testing.tiny vibevoice DIR``.
"""

from __future__ import annotations

from typing import Any

from omnistage.info import CodeFrames, PipelineInfo, SpeechInfo
from omnistage.models.shared.chat_to_speech import speak_last_user_message
from omnistage.models.vibevoice import tiny
from omnistage.models.vibevoice.config import ARCHITECTURE, SAMPLE_RATE
from omnistage.pipeline import Pipeline, StageSpec, lazy


def shape_request(prompt: dict[str, Any], params: list[Any]) -> None:
    speak_last_user_message(prompt)


PIPELINE = Pipeline(
    name="vibevoice",
    description="VibeVoice: LM + diffusion head stream latent frames through the acoustic decoder "
    "(multi-speaker scripts -> 24 kHz speech)",
    matches=lambda folder: folder.omnistage_pipeline is None and ARCHITECTURE in folder.architectures,
    stages=[
        StageSpec(
            0,
            kind="ar",
            knobs="llm",
            name="speech",
            output="audio",
            final=True,
            engine=lazy("omnistage.models.vibevoice.engine:build_engine"),
        )
    ],
    info=PipelineInfo(
        speech=SpeechInfo(
            sample_rate=SAMPLE_RATE,
            supports_voice_cloning=True,
            frames=CodeFrames(
                "vibevoice_acoustic", takes_min_tokens=False, repeatable={"seed": 0}, initial_chunk_frames=1
            ),
        )
    ),
    shape_request=shape_request,
)
PIPELINES = [PIPELINE]
TINY = {"vibevoice": tiny.build}
