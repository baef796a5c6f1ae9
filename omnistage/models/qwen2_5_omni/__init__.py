"""``qwen2_5_omni``: Qwen2.5-Omni — thinker (vLLM) -> talker -> token2wav (DiT + BigVGAN); text and speech.

Stage 0 ``thinker`` (llm, vLLM's own ``Qwen2_5OmniThinkerForConditionalGeneration``): the chat reply as text and
token ids, and for the talker the hidden states of prompt + reply, handed out by its own engine (``thinker.py``).
Stage 1 ``talker``: codec codes on omnistage's step-batched AR engine over transformers' talker
(``talker_engine.py``, ``talker_model.py``). Stage 2 ``token2wav`` (generation): DiT flow sampling + BigVGAN,
24 kHz audio (``token2wav.py``). With async chunk on (the default) the talker starts with the thinker's second token
and steps as its hidden states arrive; token2wav starts when the talker finished (its DiT attends across the whole
code sequence; docs/architecture.md says what that costs).

- ``modalities: ["text"]`` runs the thinker only; ``["text", "audio"]`` (default) all three.
- Voices are the speakers of the checkpoint's ``spk_dict.pt`` (``Chelsie``, ``Ethan`` in the release); default
  ``Chelsie`` as in transformers. A request picks one with ``additional_information.voice`` (HTTP: chat
  ``audio.voice``, ``extra_body.speaker``, speech ``voice``) or the talker's ``speaker`` sampling param.
- Per-stage sampling (``sampling_params_list``): vLLM ``SamplingParams`` keys for the thinker and the talker
  (``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``, ``max_tokens`` — the talker's counts codes, as
  ``talker_max_new_tokens`` — ``seed``); token2wav takes ``num_steps``, ``guidance_scale``, ``sway_coefficient``
  and ``seed`` (its initial noise; the request's ``seed`` reaches it).
- A folder without audio output (``enable_audio_output: false``, no talker or no ``spk_dict.pt``) resolves to
  ``qwen2_5_omni_thinker``: the thinker alone, text out.

Tiny fixture: ``python -m omnistage.testing.tiny qwen2_5_omni DIR``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnistage.models.qwen2_5_omni import tiny
from omnistage.models.qwen2_5_omni.config import ARCHITECTURE, SAMPLE_RATE, load_omni25_config
from omnistage.models.qwen2_5_omni.edges import talker_to_token2wav, thinker_to_talker, thinker_to_talker_chunks
from omnistage.models.transcription_chat import TRANSCRIPTION_INFO, to_transcription_chat
from omnistage.pipeline import Edge, ModelFolder, Pipeline, StageContext, StageSpec


def thinker_engine(ctx: StageContext) -> Any:
    from omnistage.models.qwen2_5_omni.thinker import build_thinker_engine  # vLLM: only when the stage starts

    return build_thinker_engine(ctx)


def speaking_thinker_engine(ctx: StageContext) -> Any:
    """The thinker that also hands the talker the hidden states of prompt + reply (thinker.py)."""
    from omnistage.models.qwen2_5_omni.thinker import build_thinker_engine

    return build_thinker_engine(ctx, feeds_talker=True)


def make_talker_engine(ctx: StageContext) -> Any:
    from omnistage.models.qwen2_5_omni.talker_engine import build_talker_engine  # torch + transformers: at start

    return build_talker_engine(ctx)


def token2wav_adapter(ctx: StageContext) -> Any:
    from omnistage.models.qwen2_5_omni.token2wav import Token2WavAdapter

    return Token2WavAdapter(ctx)


def _omni_folder(folder: ModelFolder) -> bool:
    return folder.omnistage_pipeline is None and ARCHITECTURE in folder.architectures


def _speaks(folder: ModelFolder) -> bool:
    return load_omni25_config(folder.path).enable_audio_output


def folder_info(folder: Path) -> dict[str, Any]:
    config = load_omni25_config(folder)
    return {"voices": config.voices if config.enable_audio_output else []}


def _thinker(output: str, engine: Any) -> StageSpec:
    return StageSpec(
        0, kind="llm", name="thinker", output=output, can_output="text+token_ids", final=True, engine=engine
    )


QWEN2_5_OMNI = Pipeline(
    name="qwen2_5_omni",
    description="Qwen2.5-Omni: thinker (vLLM) -> talker -> token2wav (DiT + BigVGAN; text and 24 kHz speech)",
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
            name="token2wav",
            output="audio",
            final=True,
            adapter=token2wav_adapter,
            inputs=[Edge(1, process=talker_to_token2wav)],
        ),
    ],
    extra_body_params={"speaker": str},
    default_deploy={"async_chunk": True},  # the talker starts with the thinker's second token (edges.py)
    info={"sample_rate": SAMPLE_RATE, "chat": True, "supports_speed": False, "transcription": TRANSCRIPTION_INFO},
    shape_request=to_transcription_chat,  # a recogniser request becomes a chat turn (transcription.py)
    folder_info=folder_info,
)
QWEN2_5_OMNI_THINKER = Pipeline(
    name="qwen2_5_omni_thinker",
    description="Qwen2.5-Omni without audio output (enable_audio_output: false, or no talker / spk_dict.pt)",
    matches=lambda folder: _omni_folder(folder) and not _speaks(folder),
    stages=[_thinker("text", thinker_engine)],
    info={"transcription": TRANSCRIPTION_INFO},
    shape_request=to_transcription_chat,
)
PIPELINES = [QWEN2_5_OMNI, QWEN2_5_OMNI_THINKER]
TINY = {"qwen2_5_omni": tiny.build}
