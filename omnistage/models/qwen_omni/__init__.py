"""``qwen_omni``: Qwen3-Omni — thinker (vLLM) -> talker (+ code predictor) -> code2wav; text and speech.

Stage 0 ``thinker`` (llm, vLLM): the chat reply as text, plus its token ids and the
rendered prompt's ids for the talker (``thinker.py``). Stage 1 ``talker``: codec
frames (G codebooks each) on omnistage's step-batched AR engine over transformers'
talker and code predictor (``talker_engine.py``, ``talker_model.py``; why not vLLM:
docs/architecture.md). Stage 2 ``code2wav`` (generation): the causal codec decoder,
24 kHz audio (``code2wav.py``). With async chunk (the default) the talker starts
after the thinker's first reply token and code2wav after the first frames.

- ``modalities: ["text"]`` runs the thinker only; ``["text", "audio"]`` (default) both.
- Voices are the checkpoint's speakers (``talker_config.speaker_id``: Chelsie, Ethan,
  Aiden in the release); default ``Ethan`` as in transformers. A request picks one with
  ``additional_information.voice`` (HTTP: chat ``audio.voice``, ``extra_body.speaker``,
  speech ``voice``) or the talker's ``speaker`` sampling param.
- Per-stage sampling (``sampling_params_list``): vLLM ``SamplingParams`` keys for the
  thinker and the talker (``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``,
  ``max_tokens`` — the talker's counts codebook-0 codes, as ``talker_max_new_tokens`` —
  ``seed``); code2wav takes ``chunk_frames`` and ``initial_codec_chunk_frames`` (async chunk piece sizes: the
  first piece, default 1 frame, then every 4). Request-level knobs
  (``max_tokens``, ``temperature``, ...) are the thinker's: the talker is not an llm-kind
  stage, so they never cut the speech.
- A folder whose config disables audio output (or has no talker) resolves to
  ``qwen_omni_thinker``: the thinker alone, text out (audio asked of it is a 400).

Tiny fixture: ``python -m omnistage.testing.tiny qwen3_omni DIR``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnistage.models.qwen_omni import tiny
from omnistage.models.qwen_omni.config import ARCHITECTURE, SAMPLE_RATE, load_omni_config
from omnistage.models.qwen_omni.edges import (
    talker_to_code2wav,
    talker_to_code2wav_chunks,
    thinker_to_talker,
    thinker_to_talker_chunks,
)
from omnistage.models.transcription_chat import TRANSCRIPTION_INFO, to_transcription_chat
from omnistage.pipeline import Edge, ModelFolder, Pipeline, StageContext, StageSpec


def thinker_engine(ctx: StageContext) -> Any:
    from omnistage.models.qwen_omni.thinker import build_thinker_engine  # vLLM: only when the stage starts

    return build_thinker_engine(ctx)


def speaking_thinker_engine(ctx: StageContext) -> Any:
    """The thinker that also hands the talker the hidden states of media prompts (thinker.py)."""
    from omnistage.models.qwen_omni.thinker import build_thinker_engine

    return build_thinker_engine(ctx, feeds_talker=True)


def make_talker_engine(ctx: StageContext) -> Any:
    from omnistage.models.qwen_omni.talker_engine import build_talker_engine  # torch + transformers: at start

    return build_talker_engine(ctx)


def code2wav_adapter(ctx: StageContext) -> Any:
    from omnistage.models.qwen_omni.code2wav import Code2WavAdapter

    return Code2WavAdapter(ctx)


def _omni_folder(folder: ModelFolder) -> bool:
    return folder.omnistage_pipeline is None and ARCHITECTURE in folder.architectures


def _speaks(folder: ModelFolder) -> bool:
    return load_omni_config(folder.path).enable_audio_output


def folder_info(folder: Path) -> dict[str, Any]:
    return {"voices": load_omni_config(folder).voices}


def _thinker(output: str, engine: Any) -> StageSpec:
    return StageSpec(
        0, kind="llm", name="thinker", output=output, can_output="text+token_ids", final=True, engine=engine
    )


QWEN_OMNI = Pipeline(
    name="qwen_omni",
    description="Qwen3-Omni: thinker (vLLM) -> talker + code predictor -> code2wav (text and 24 kHz speech)",
    matches=lambda folder: _omni_folder(folder) and _speaks(folder),
    stages=[
        _thinker("text+token_ids", speaking_thinker_engine),  # the reply's ids feed the talker
        StageSpec(
            1,
            kind="generation",
            name="talker",
            output="token_ids",
            engine=make_talker_engine,
            inputs=[Edge(0, process=thinker_to_talker, process_chunk=thinker_to_talker_chunks)],
        ),
        StageSpec(
            2,
            kind="generation",
            name="code2wav",
            output="audio",
            final=True,
            adapter=code2wav_adapter,
            inputs=[Edge(1, process=talker_to_code2wav, process_chunk=talker_to_code2wav_chunks)],
        ),
    ],
    extra_body_params={"speaker": str},
    default_deploy={"async_chunk": True},
    info={"sample_rate": SAMPLE_RATE, "chat": True, "supports_speed": False, "transcription": TRANSCRIPTION_INFO},
    shape_request=to_transcription_chat,  # a recogniser request becomes a chat turn (transcription.py)
    folder_info=folder_info,
)
QWEN_OMNI_THINKER = Pipeline(
    name="qwen_omni_thinker",
    description="Qwen3-Omni without audio output (Thinking / Captioner, or enable_audio_output: false): the thinker",
    matches=lambda folder: _omni_folder(folder) and not _speaks(folder),
    stages=[_thinker("text", thinker_engine)],
    info={"transcription": TRANSCRIPTION_INFO},
    shape_request=to_transcription_chat,
)
PIPELINES = [QWEN_OMNI, QWEN_OMNI_THINKER]
TINY = {"qwen3_omni": tiny.build}
