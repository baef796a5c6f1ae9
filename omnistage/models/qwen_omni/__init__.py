"""``qwen_omni``: Qwen3-Omni — thinker (vLLM) -> talker (+ code predictor) -> code2wav; text and speech.

Stage 0 ``thinker`` (llm, vLLM): the chat reply as text, plus its token ids and the
rendered prompt's ids for the talker (``thinker.py``). Stage 1 ``talker``: codec
frames (G codebooks each) on omnistage's step-batched AR engine over transformers'
talker and code predictor (``talker_engine.py``, ``talker_model.py``; why not vLLM:
docs/families/qwen_omni.md). Stage 2 ``code2wav`` (generation): the causal codec decoder,
24 kHz audio (``code2wav.py``). With async chunk (the default) the talker starts
after the thinker's first reply token and code2wav after the first frames.

- ``modalities: ["text"]`` runs the thinker only; ``["text", "audio"]`` (default) both.
- Voices are the checkpoint's speakers (``talker_config.speaker_id``: Chelsie, Ethan,
  Aiden in the release); default ``Ethan`` as in transformers. A request picks one with
  ``SpeechInput(voice=...)`` (HTTP: chat ``audio.voice``, ``extra_body.speaker``,
  speech ``voice``) or the talker's ``speaker`` sampling param.
- Per-stage sampling (``sampling_params_list``): vLLM ``SamplingParams`` keys for the
  thinker and the talker (``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``,
  ``max_tokens`` — the talker's counts codebook-0 codes, as ``talker_max_new_tokens`` —
  ``seed``); code2wav takes ``chunk_frames`` and ``initial_codec_chunk_frames`` (async chunk piece sizes: the
  first piece, default 1 frame, then every 4). Request-level knobs
  (``max_tokens``, ``temperature``, ...) are the thinker's: the talker takes none of them
  (``knobs="none"``), so they never cut the speech.
- A folder whose config disables audio output (or has no talker) resolves to
  ``qwen_omni_thinker``: the thinker alone, text out (audio asked of it is a 400).

Tiny fixture: ``python -m omnistage.testing.tiny qwen3_omni DIR``.
"""

from __future__ import annotations

from omnistage.models.qwen_omni import tiny
from omnistage.models.qwen_omni.config import ARCHITECTURE, CODE2WAV_PARAM_KEYS, SAMPLE_RATE, load_omni_config
from omnistage.models.qwen_omni.edges import (
    talker_to_code2wav,
    talker_to_code2wav_chunks,
    thinker_to_talker,
    thinker_to_talker_chunks,
)
from omnistage.models.shared.omni.pipelines import omni_pipelines
from omnistage.pipeline import Edge, StageSpec, lazy

PIPELINES = omni_pipelines(
    "qwen_omni",
    package="omnistage.models.qwen_omni",
    architecture=ARCHITECTURE,
    description="Qwen3-Omni: thinker (vLLM) -> talker + code predictor -> code2wav (text and 24 kHz speech)",
    thinker_description="Qwen3-Omni without audio output (Thinking / Captioner, or enable_audio_output: false): "
    "the thinker",
    speaks=lambda folder: load_omni_config(folder).enable_audio_output,
    voices=lambda folder: load_omni_config(folder).voices,
    talker_input=Edge(0, process=thinker_to_talker, process_chunk=thinker_to_talker_chunks),
    decoder=StageSpec(
        2,
        kind="generation",
        name="code2wav",
        output="audio",
        final=True,
        adapter=lazy("omnistage.models.qwen_omni.code2wav:Code2WavAdapter"),
        inputs=[Edge(1, process=talker_to_code2wav, process_chunk=talker_to_code2wav_chunks)],
        param_keys=CODE2WAV_PARAM_KEYS,
    ),
    sample_rate=SAMPLE_RATE,
)
QWEN_OMNI, QWEN_OMNI_THINKER = PIPELINES
TINY = {"qwen3_omni": tiny.build}
