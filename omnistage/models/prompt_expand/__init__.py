"""``prompt_expand``: an LLM rewrites the user's prompt, an image model draws it.

Stage 0 (llm, output ``text``) turns the prompt into a detailed image
description, guided by a system prompt; stage 1 (diffusion, output ``image``)
is the diffusion stage of whichever image family the image folder resolves
to (sd3, sd, ...), reusing that family's adapter unchanged. Both are final:
a request gets the expanded text and the image; ``modalities: ["text"]`` runs
stage 0 only; ``["image"]`` runs both and returns only the image.

Choosing the two models — a folder laid out as::

    my-expander/
      omnistage.json   {"pipeline": "prompt_expand", "system_prompt": "..."}   (system_prompt optional)
      llm/             a vLLM causal-LM folder (or a symlink to one)
      image/           a diffusers image folder (or a symlink to one)

Either stage's folder can instead be given in the deploy YAML with
``stages: [{stage_id: 0, model: /path/to/llm}, {stage_id: 1, model: /path/to/image}]``
(a stage's own ``model`` wins over the subfolder). The system prompt can be
overridden per request with the prompt's ``system_prompt``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from omnistage.pipeline import Edge, Pipeline, StageContext, StageSpec

DEFAULT_SYSTEM_PROMPT = (
    "You rewrite image prompts. Expand the user's short prompt into one detailed, vivid description "
    "of the image: subject, setting, composition, lighting, colours and style. Answer with the "
    "description only."
)


def stage_folder(ctx: StageContext, subfolder: str) -> Path:
    """The stage's own ``model:`` from the deploy config, else ``<model folder>/<subfolder>``."""
    if ctx.deploy.model:
        return Path(ctx.deploy.model)
    if ctx.model is None:
        raise ValueError(f"stage {ctx.spec.stage_id}: prompt_expand needs a model folder (see the family docs)")
    return Path(ctx.model) / subfolder


def system_prompt(ctx: StageContext) -> str:
    if ctx.model and not ctx.deploy.model:
        meta = Path(ctx.model) / "omnistage.json"
        if meta.is_file():
            return json.loads(meta.read_text()).get("system_prompt") or DEFAULT_SYSTEM_PROMPT
    return DEFAULT_SYSTEM_PROMPT


def build_llm_stage(ctx: StageContext):
    from omnistage.models.prompt_expand.expander import PromptExpanderEngine

    folder = stage_folder(ctx, "llm")
    return PromptExpanderEngine(replace(ctx, model=str(folder)), system_prompt(ctx))


def build_image_stage(ctx: StageContext):
    """The image folder's own family decides the adapter."""
    from omnistage.pipeline import resolve_pipeline
    from omnistage.stages.diffusion.engine import DiffusionStageEngine

    folder = stage_folder(ctx, "image")
    family = resolve_pipeline(folder)
    diffusion = [s for s in family.stages if s.kind == "diffusion"]
    if len(family.stages) != 1 or not diffusion:
        raise ValueError(
            f"stages[1].model: {folder} resolves to pipeline {family.name!r}, "
            "which is not a one-stage image diffusion family"
        )
    spec = replace(ctx.spec, adapter=diffusion[0].adapter, engine=None, model_subfolder=None)
    return DiffusionStageEngine(replace(ctx, spec=spec, model=str(folder)))


def image_family_extras(folder: Path) -> dict[str, type]:
    """The model-specific request keys of the image family the folder wraps (e.g. sd3's ``mu``)."""
    from omnistage.pipeline import resolve_pipeline

    image = folder / "image"
    return dict(resolve_pipeline(image).extra_body_params) if image.is_dir() else {}


def expanded_to_image_prompt(source: dict[str, Any], request: Any) -> dict[str, Any]:
    """Stage 0's text becomes stage 1's prompt; the caller's negative prompt and images pass through."""
    text = (source.get("text") or "").strip()
    if not text:
        raise ValueError("the prompt expander produced no text (try a larger max_tokens)")
    out: dict[str, Any] = {"prompt": text}
    for key in ("negative_prompt", "multi_modal_data"):
        if request.prompt.get(key) is not None:
            out[key] = request.prompt[key]
    return out


PIPELINE = Pipeline(
    name="prompt_expand",
    description="an LLM expands the prompt, an image family draws it (text + image)",
    # Selected by omnistage.json {"pipeline": "prompt_expand"}: two models cannot be guessed from one folder.
    matches=None,
    stages=[
        StageSpec(
            0,
            kind="llm",
            name="expander",
            output="text",
            can_output="text+token_ids",
            final=True,
            engine=build_llm_stage,
            default_params={"temperature": 0.0, "max_tokens": 96},
        ),
        StageSpec(
            1,
            kind="diffusion",
            name="image",
            output="image",
            can_output="image,latent",
            final=True,
            engine=build_image_stage,
            inputs=[Edge(0, process=expanded_to_image_prompt)],
        ),
    ],
    folder_extra_body_params=image_family_extras,
)
PIPELINES = [PIPELINE]
TINY: dict = {}  # a folder of two other families' models (see the docstring)
