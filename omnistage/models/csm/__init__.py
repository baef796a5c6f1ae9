"""``csm``: Sesame CSM (transformers ``CsmForConditionalGeneration``) — backbone + depth decoder -> Mimi.

Stage 0 ``backbone`` (``ar``, omnistage's step-batched AR engine over the transformers modules,
``engine.py`` / ``model.py``; why not vLLM: ``omnistage.stages.ar.engine``): one frame of K Mimi
codes per step — codebook 0 from the Llama backbone, codebooks 1..K-1 from the depth decoder run
inside the step. Stage 1 ``codec`` (generation): the checkpoint's own Mimi, decoded as codec_tts
decodes it (``codec.py``); with async chunk (the default) the first frame is decoded as soon as it
exists, then every ``chunk_frames`` (Mimi is causal: the streamed audio equals the whole decode).

- Voices are CSM speaker ids (``"0"``, ``"1"``; ``voice`` on /v1/audio/speech, or the prompt's
  ``SpeechInput(voice=...)``). A reference clip (``ref_audio`` + its transcript ``ref_text``)
  becomes an earlier turn of that speaker: CSM's conversational context is its voice prompt. More
  earlier turns: ``SpeechInput(context=[SpeechTurn(speaker=..., text=..., audio=(samples, rate))])``.
- Params of stage 0: ``temperature``, ``top_k``, ``top_p``, ``max_tokens`` (frames, as transformers'
  ``max_new_tokens``), ``seed`` (request knobs reach it: it takes the llm knobs), and ``depth_decoder_temperature``
  / ``_top_k`` / ``_top_p``; defaults from the checkpoint's ``generation_config.json``. ``temperature: 0``
  makes both models greedy unless ``depth_decoder_temperature`` is given.
- Stage 1 takes ``chunk_frames`` and ``initial_codec_chunk_frames`` (also on /v1/audio/speech).

Tiny fixture: ``python -m omnistage.testing.tiny csm DIR``.
"""

from __future__ import annotations

from omnistage.info import CodeFrames, PipelineInfo, SpeechInfo
from omnistage.models.csm import tiny
from omnistage.models.csm.config import ARCHITECTURE, INITIAL_CHUNK_FRAMES, SAMPLE_RATE, VOICES
from omnistage.models.csm.edges import codes_in_chunks, whole_codes
from omnistage.models.shared.speech_family import lm_then_decoder

PIPELINE = lm_then_decoder(
    "csm",
    "Sesame CSM: backbone + depth decoder stream Mimi frames to the Mimi decoder (text -> 24 kHz speech)",
    architecture=ARCHITECTURE,
    lm="omnistage.models.csm.engine:build_backbone_engine",
    lm_name="backbone",
    decoder="omnistage.models.csm.codec:CsmCodecAdapter",
    whole=whole_codes,
    chunks=codes_in_chunks,
    info=PipelineInfo(
        chat=False,
        speech=SpeechInfo(
            sample_rate=SAMPLE_RATE,
            voices=VOICES,
            default_voice=VOICES[0],
            supports_voice_cloning=True,
            frames=CodeFrames("mimi", 1920, takes_min_tokens=False, initial_chunk_frames=INITIAL_CHUNK_FRAMES),
        ),
    ),
)
PIPELINES = [PIPELINE]
TINY = {"csm": tiny.build}
