"""``qwen3_tts``: Qwen3-TTS (12 Hz; CustomVoice, VoiceDesign and Base checkpoints, 1.7B and 0.6B) — talker +
code predictor -> the speech tokenizer's decoder.

Resolved from ``config.json`` (``architectures: ["Qwen3TTSForConditionalGeneration"]``; ``tts_model_type``
picks the mode). Stage 0 ``talker`` (``ar``, omnistage's step-batched AR engine, ``engine.py`` /
``talker.py``; why not vLLM: ``omnistage.stages.ar.engine``): one frame of G codes per step — codebook 0
from the talker, 1..G-1 from the code predictor run inside the step. Stage 1 ``decoder`` (generation):
the 12 Hz speech tokenizer's causal decoder (``speech_decoder.py``), streamed statefully (its attention
window per request; the convolutions' few frames of left context re-decoded; equal to the whole decode):
the first ``initial_codec_chunk_frames`` frames as soon as they exist, then every ``chunk_frames``.
Base checkpoints clone: ``speech_encoder.py`` turns ``ref_audio`` into reference codes (transformers'
``MimiModel``) and an x-vector. What is re-implemented and why: docs/families/qwen3_tts.md.

- Voices: the checkpoint's preset speakers (CustomVoice), matched case-insensitively as ``qwen-tts`` does;
  ``instructions`` (VoiceDesign, CustomVoice 1.7B); ``language`` (``Auto`` by default); Base:
  ``ref_audio`` + ``ref_text``, or ``x_vector_only_mode``; registered voices (/v1/audio/voices).
- Params of stage 0: ``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``, ``max_tokens`` (talker
  tokens, as the package's ``max_new_tokens``: N tokens make at most N - 1 frames), ``seed``, and
  ``subtalker_temperature`` / ``_top_k`` / ``_top_p`` (the code predictor); defaults from the checkpoint's
  ``generation_config.json``. ``temperature: 0`` is greedy in both unless ``subtalker_temperature`` is given.

Chat: ``/v1/chat/completions`` with ``modalities: ["audio"]`` (``audio.voice``) and offline ``{"messages": ...}``
speak the last user message's text (``shared/chat_to_speech.py``), the same audio as /v1/audio/speech for that text and voice.

Tiny fixtures: ``tests/models/qwen3_tts/tiny/`` (built by ``scripts/reference/qwen3_tts/``).
"""

from __future__ import annotations

from typing import Any

from omnistage.info import CodeFrames, PipelineInfo, SpeechInfo
from omnistage.models.qwen3_tts.config import ARCHITECTURE, INITIAL_CHUNK_FRAMES, SAMPLE_RATE, folder_info
from omnistage.models.qwen3_tts.edges import codes_in_chunks, whole_codes
from omnistage.models.shared.chat_to_speech import speak_last_user_message
from omnistage.models.shared.codec_lm.stages import chunk_sizes_to_codec_stage
from omnistage.models.shared.speech_family import lm_then_decoder


def shape_request(prompt: dict[str, Any], params: list[Any]) -> None:
    speak_last_user_message(prompt)  # chat turns (/v1/chat/completions, offline messages): shared/chat_to_speech.py
    chunk_sizes_to_codec_stage(prompt, params)


PIPELINE = lm_then_decoder(
    "qwen3_tts",
    "Qwen3-TTS: talker + code predictor stream 12 Hz codes to the speech tokenizer's decoder "
    "(text -> 24 kHz speech; preset voices, voice design, voice cloning)",
    architecture=ARCHITECTURE,
    lm="omnistage.models.qwen3_tts.engine:build_talker_engine",
    lm_name="talker",
    decoder="omnistage.models.qwen3_tts.speech_decoder:decoder_adapter",
    decoder_name="decoder",
    whole=whole_codes,
    chunks=codes_in_chunks,
    info=PipelineInfo(
        speech=SpeechInfo(
            sample_rate=SAMPLE_RATE,
            voices_case_insensitive=True,
            clones_from_embedding=True,
            frames=CodeFrames(
                "qwen3_tts_12hz",
                1920,
                lead_tokens=1,
                repeatable={"temperature": 0.0, "repetition_penalty": 1.0},
                initial_chunk_frames=INITIAL_CHUNK_FRAMES,
            ),
        )
    ),
    folder_info=folder_info,
    shape_request=shape_request,
)
PIPELINES = [PIPELINE]
TINY: dict[str, Any] = {}  # the tiny checkpoints come from the reference package: tests/models/qwen3_tts/tiny/
