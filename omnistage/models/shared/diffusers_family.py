"""The template "a diffusers pipeline on the diffusion engine": one diffusion stage, matched by the pipeline class
a folder's ``model_index.json`` names, with the family's shipped deploy YAML beside its ``__init__.py``.

A family built on it declares only what differs: its classes, adapter, output, ``__call__`` defaults and knobs
(docs/adding-a-family.md, checklist A).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from omnistage.info import PipelineInfo
from omnistage.pipeline import ModelFolder, Pipeline, StageSpec


def diffusion_stage(
    adapter: type, output: str, defaults: Mapping[str, Any], *, latent_output: bool = True
) -> StageSpec:
    """The one final diffusion stage: ``output`` by default; each of its parts, and the latents unless
    ``latent_output`` is False, on request (``engine_output_type``)."""
    can_output = ",".join([*output.split("+"), "latent"]) if latent_output else None
    return StageSpec(
        0,
        kind="diffusion",
        adapter=adapter,
        output=output,
        can_output=can_output,
        final=True,
        default_params=dict(defaults),
    )


def diffusers_pipeline(
    family_file: str,
    name: str,
    description: str,
    *,
    classes: str | Iterable[str],
    adapter: type,
    output: str,
    defaults: Mapping[str, Any],
    latent_output: bool = True,
    extra_body_params: Mapping[str, type] | None = None,
    info: PipelineInfo | None = None,
    when: Callable[[ModelFolder], bool] | None = None,
) -> Pipeline:
    """A one-stage diffusers family. ``family_file``: the family's ``__file__`` (its ``deploy.yaml`` is beside it);
    ``classes``: the diffusers pipeline class name(s) it serves; ``defaults``: that pipeline's ``__call__``
    defaults for the knobs it has; ``when``: a further test of the folder, where one class serves two pipelines
    (FLUX.1-dev and -schnell)."""
    wanted = frozenset([classes] if isinstance(classes, str) else classes)
    return Pipeline(
        name=name,
        description=description,
        matches=lambda f: f.diffusers_class in wanted and (when is None or when(f)),
        stages=[diffusion_stage(adapter, output, defaults, latent_output=latent_output)],
        extra_body_params=dict(extra_body_params or {}),
        info=info or PipelineInfo(),
        deploy_file=Path(family_file).with_name("deploy.yaml"),
    )
