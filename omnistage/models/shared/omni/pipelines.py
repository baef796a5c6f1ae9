"""The two pipelines of a Qwen-Omni family, declared once: the speaking one (thinker -> talker -> decoder) and the
thinker alone, which a folder without audio output resolves to. A family gives what differs (its package, its
edges, its decoder stage, how a folder says it speaks and which voices it has)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from omnistage.info import PipelineInfo, SpeechInfo
from omnistage.models.shared.omni.sampling import TALKER_PARAM_KEYS
from omnistage.models.shared.transcription_chat import TRANSCRIPTION_INFO, to_transcription_chat
from omnistage.pipeline import Edge, ModelFolder, Pipeline, StageSpec, lazy


def _thinker(package: str, output: str, feeds_talker: bool) -> StageSpec:
    # feeding the talker, the thinker also hands it the hidden states it reads (the family's thinker.py)
    build = f"{package}.thinker:build_thinker_engine"
    return StageSpec(
        0,
        kind="llm",
        name="thinker",
        output=output,
        can_output="text+token_ids",
        final=True,
        engine=lazy(build, feeds_talker=True) if feeds_talker else lazy(build),
    )


def omni_pipelines(
    name: str,
    *,
    package: str,
    architecture: str,
    description: str,
    thinker_description: str,
    speaks: Callable[[Path], bool],
    voices: Callable[[Path], Sequence[str]],
    talker_input: Edge,
    decoder: StageSpec,
    sample_rate: int,
) -> list[Pipeline]:
    """``name`` (thinker -> talker -> ``decoder``, text and speech) and ``name``_thinker (text only).

    ``package`` holds ``thinker.build_thinker_engine(ctx, feeds_talker=False)`` and
    ``talker_engine.build_talker_engine(ctx)``; ``talker_input`` is the talker's edge from the thinker;
    ``decoder`` is stage 2, reading the talker; ``speaks(folder)`` says whether a folder's config enables audio
    output and ``voices(folder)`` lists its speakers."""

    def omni_folder(folder: ModelFolder) -> bool:
        return folder.omnistage_pipeline is None and architecture in folder.architectures

    def folder_info(folder: Path, info: PipelineInfo) -> PipelineInfo:
        return info.with_speech(voices=voices(folder))

    talker = StageSpec(
        1,
        kind="ar",
        name="talker",
        output="token_ids",
        engine=lazy(f"{package}.talker_engine:build_talker_engine"),
        inputs=[talker_input],
        # the request's top-level knobs (max_tokens, temperature, ...) are the thinker's: they never cut the speech
        knobs="none",
        param_keys=TALKER_PARAM_KEYS,
    )
    speaking = Pipeline(
        name=name,
        description=description,
        matches=lambda folder: omni_folder(folder) and speaks(folder.path),
        stages=[_thinker(package, "text+token_ids", feeds_talker=True), talker, decoder],
        extra_body_params={"speaker": str},
        default_deploy={"async_chunk": True},
        info=PipelineInfo(speech=SpeechInfo(sample_rate=sample_rate), transcription=TRANSCRIPTION_INFO),
        shape_request=to_transcription_chat,  # a recogniser request becomes a chat turn
        folder_info=folder_info,
    )
    thinker_only = Pipeline(
        name=f"{name}_thinker",
        description=thinker_description,
        matches=lambda folder: omni_folder(folder) and not speaks(folder.path),
        stages=[_thinker(package, "text", feeds_talker=False)],
        info=PipelineInfo(transcription=TRANSCRIPTION_INFO),
        shape_request=to_transcription_chat,
    )
    return [speaking, thinker_only]
