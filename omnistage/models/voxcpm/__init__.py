"""``voxcpm``: VoxCPM2 (OpenBMB's ``voxcpm`` 2.0.3) — a tokenizer-free LM whose every step samples a patch of
continuous audio latents with a small local diffusion transformer -> the audio VAE's causal decoder
(text -> speech at the VAE's output rate, 48 kHz in the release).

Stage 0 ``lm`` (``ar``, omnistage's step-batched AR engine, ``engine.py`` / ``model.py``; why not vLLM: each
step's input is a continuous latent patch drawn by a nested diffusion model, which vLLM's API cannot feed a
running request): one latent patch per step, the local DiT of every running request in one batch. Stage 1
``decoder`` (generation): the audio VAE's causal decoder (``codec.py``), streamed per piece of patches with its
receptive field in front (exact).

- Voices: ``default`` (the model's own voice for the text), or a clone: ``ref_audio`` alone (the release's
  reference mode) or with ``ref_text`` (its transcript: the speech continues the clip), or a registered voice.
- Params of stage 0: ``temperature`` (the DiT's start-noise scale, 1.0 as the release; 0 draws none),
  ``seed``, ``cfg_value``, ``inference_timesteps``, ``min_tokens`` and ``max_tokens`` (LM steps, one patch
  each; the release also caps them at 6 per text token + 10).
- Stage 1 takes ``chunk_frames`` and ``initial_codec_chunk_frames`` (in patches; also on /v1/audio/speech).

Tiny fixture: ``python -m omnistage.testing.tiny voxcpm DIR``.
"""

from __future__ import annotations

from omnistage.info import CodeFrames, PipelineInfo, SpeechInfo
from omnistage.models.shared.speech_family import lm_then_decoder
from omnistage.models.voxcpm import tiny
from omnistage.models.voxcpm.config import (
    INITIAL_CHUNK_FRAMES,
    MAX_REF_AUDIO_S,
    PARAM_KEYS,
    SAMPLE_RATE,
    VOICES,
    folder_info,
    is_voxcpm,
)
from omnistage.models.voxcpm.edges import latents_in_chunks, whole_latents

PIPELINE = lm_then_decoder(
    "voxcpm",
    "VoxCPM2: an LM with a local diffusion head streams audio latents to its VAE decoder (text -> speech)",
    matches=lambda folder: folder.omnistage_pipeline is None and is_voxcpm(folder.path),
    lm="omnistage.models.voxcpm.engine:build_lm_engine",
    lm_output="latent",
    param_keys=PARAM_KEYS,
    decoder="omnistage.models.voxcpm.codec:VoxDecoderAdapter",
    decoder_name="decoder",
    decoder_knobs="none",
    whole=whole_latents,
    chunks=latents_in_chunks,
    info=PipelineInfo(
        chat=False,
        speech=SpeechInfo(
            sample_rate=SAMPLE_RATE,
            voices=VOICES,
            default_voice=VOICES[0],
            supports_voice_cloning=True,
            max_ref_audio_s=MAX_REF_AUDIO_S,
            frames=CodeFrames("voxcpm_audio_vae", initial_chunk_frames=INITIAL_CHUNK_FRAMES),
        ),
    ),
    folder_info=folder_info,
)
PIPELINES = [PIPELINE]
TINY = {"voxcpm": tiny.build}
