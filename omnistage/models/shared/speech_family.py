"""The template "a codec LM + decoder that speaks": stage 0 an LM on the step engine (``kind="ar"``) that emits
codec codes, stage 1 a decoder (``kind="generation"``) that turns them into audio — streamed chunk by chunk when
the family gives a chunk edge, whole otherwise. Matched by the ``architectures`` entry of a folder's config.

A family built on it declares only what differs: its engine and decoder, the edges that cut its codes, its
speech info (docs/adding-a-family.md, checklist B).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from omnistage.info import PipelineInfo
from omnistage.models.shared.codec_lm.stages import chunk_sizes_to_codec_stage
from omnistage.pipeline import (
    Edge,
    EdgeChunkProcess,
    EdgeProcess,
    ModelFolder,
    Pipeline,
    RequestHook,
    StageKnobs,
    StageSpec,
    lazy,
)


def by_architecture(architecture: str) -> Callable[[ModelFolder], bool]:
    """A folder whose config names ``architecture`` (and that no ``omnistage.json`` assigns elsewhere)."""
    return lambda folder: folder.omnistage_pipeline is None and architecture in folder.architectures


def lm_then_decoder(
    name: str,
    description: str,
    *,
    architecture: str | None = None,
    matches: Callable[[ModelFolder], bool] | None = None,
    lm: str,
    decoder: str,
    whole: EdgeProcess,
    chunks: EdgeChunkProcess | None = None,
    info: PipelineInfo,
    lm_name: str = "lm",
    lm_output: str = "token_ids",
    decoder_name: str = "codec",
    lm_knobs: StageKnobs = "llm",
    decoder_knobs: StageKnobs | None = None,
    param_keys: Iterable[str] | None = None,
    folder_info: Callable[..., PipelineInfo] | None = None,
    shape_request: RequestHook | None = None,
) -> Pipeline:
    """``lm``: ``"module:factory"`` of the stage-0 step engine; ``decoder``: ``"module:adapter"`` of stage 1;
    ``whole`` / ``chunks``: the edge processors handing stage 0's codes on whole / as they stream. With
    ``chunks`` the pipeline streams by default (async chunk) and a request's codec chunk sizes reach stage 1
    (``shape_request`` replaces that hook; a family's own hook then calls ``chunk_sizes_to_codec_stage``).
    ``architecture`` matches the folder config's ``architectures``; a release whose config names none gives its own
    ``matches`` instead. ``lm_output``: what stage 0 hands on (``"latent"`` for an LM of continuous latents)."""
    if (architecture is None) == (matches is None):
        raise TypeError(f"pipeline {name!r}: give architecture or matches, not both or neither")
    streams = chunks is not None
    return Pipeline(
        name=name,
        description=description,
        matches=matches or by_architecture(architecture),
        stages=[
            StageSpec(
                0,
                kind="ar",
                knobs=lm_knobs,
                name=lm_name,
                output=lm_output,
                engine=lazy(lm),
                param_keys=frozenset(param_keys) if param_keys is not None else None,
            ),
            StageSpec(
                1,
                kind="generation",
                knobs=decoder_knobs,
                name=decoder_name,
                output="audio",
                final=True,
                adapter=lazy(decoder),
                inputs=[Edge(0, process=whole, process_chunk=chunks)],
            ),
        ],
        default_deploy={"async_chunk": True} if streams else {},
        info=info,
        folder_info=folder_info,
        shape_request=shape_request or (chunk_sizes_to_codec_stage if streams else None),
    )
