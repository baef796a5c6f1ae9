"""``higgs_audio``: Higgs Audio v2 (transformers ``HiggsAudioV2ForConditionalGeneration``) — LM with a
delay pattern over N codebooks -> the audio tokenizer's decoder (text -> 24 kHz speech).

Stage 0 ``lm`` (``ar``, omnistage's step-batched AR engine over the transformers modules, ``engine.py`` /
``model.py``; why not vLLM: vLLM 0.32 has no Higgs Audio architecture, and each step's input is a frame of
N codebooks): one delayed frame of N codes per step, emitted un-delayed (``model.py``). Stage 1 ``codec``
(generation): the checkpoint's audio tokenizer decoder (``audio_tokenizer/``, ``codec.py``), streamed per
frame group with its whole receptive field on both sides (exact).

- Voices: ``default`` (the model picks a voice for the text), or a clone: ``ref_audio`` + ``ref_text`` (or a
  voice registered through /v1/audio/voices), encoded by the checkpoint's audio tokenizer
  (``shared/higgs_tokenizer/encoder.py``). ``instructions`` becomes the release's scene description; several
  speakers are written in the text as the release's chat takes them (``[SPEAKER0] ... [SPEAKER1] ...``).
- Params of stage 0: ``temperature``, ``top_k``, ``top_p``, ``max_tokens`` (LM steps, as transformers'
  ``max_new_tokens``), ``seed``, ``ras_win_len`` / ``ras_win_max_num_repeat`` (repetition-aware sampling);
  defaults from the checkpoint's ``generation_config.json``.
- Stage 1 takes ``chunk_frames`` and ``initial_codec_chunk_frames`` (also on /v1/audio/speech).

Tiny fixture: ``python -m omnistage.testing.tiny higgs_audio DIR``.
"""

from __future__ import annotations

from omnistage.info import CodeFrames, PipelineInfo, SpeechInfo
from omnistage.models.higgs_audio import tiny
from omnistage.models.higgs_audio.config import (
    ARCHITECTURE,
    INITIAL_CHUNK_FRAMES,
    MAX_REF_AUDIO_S,
    PARAM_KEYS,
    SAMPLE_RATE,
    VOICES,
    folder_info,
)
from omnistage.models.higgs_audio.edges import codes_in_chunks, whole_codes
from omnistage.models.shared.speech_family import lm_then_decoder

PIPELINE = lm_then_decoder(
    "higgs_audio",
    "Higgs Audio v2: a delay-pattern LM streams codec frames to its audio tokenizer's decoder (text -> 24 kHz speech)",
    architecture=ARCHITECTURE,
    lm="omnistage.models.higgs_audio.engine:build_lm_engine",
    param_keys=PARAM_KEYS,
    decoder="omnistage.models.higgs_audio.codec:HiggsCodecAdapter",
    whole=whole_codes,
    chunks=codes_in_chunks,
    info=PipelineInfo(
        chat=False,
        speech=SpeechInfo(
            sample_rate=SAMPLE_RATE,
            voices=VOICES,
            default_voice=VOICES[0],
            supports_voice_cloning=True,
            max_ref_audio_s=MAX_REF_AUDIO_S,
            frames=CodeFrames(
                "higgs_audio_v2_tokenizer",
                960,
                takes_min_tokens=False,
                repeatable={"temperature": 0.0, "ras_win_len": 0},
                initial_chunk_frames=INITIAL_CHUNK_FRAMES,
            ),
        ),
    ),
    folder_info=folder_info,
)
PIPELINES = [PIPELINE]
TINY = {"higgs_audio": tiny.build}
