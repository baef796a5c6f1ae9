"""Route a request's generic fields to the pipeline's stages (SPEC §5).

Standard diffusion keys go to the stages that denoise (diffusion stages; in a
pipeline without one, its final generation stages); vLLM keys go to llm
stages; model-specific keys become ``extra_args``, kept only when the
pipeline declares them. An explicit ``sampling_params_list`` entry wins over
the routed generic fields for its stage.
"""

from __future__ import annotations

import logging
from typing import Any

from omnistage.params import DiffusionSamplingParams
from omnistage.server.errors import bad_request, field_of
from omnistage.server.protocol import parse_size

logger = logging.getLogger(__name__)

DIFFUSION_KEYS = ("height", "width", "num_inference_steps", "guidance_scale", "guidance_scale_2", "true_cfg_scale",
                  "negative_prompt", "seed", "strength", "num_frames", "fps")
LLM_KEYS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "min_tokens", "seed", "stop", "stop_token_ids",
            "presence_penalty", "frequency_penalty", "repetition_penalty", "ignore_eos")


def denoising_stages(engine: Any) -> list[int]:
    stages = engine.pipeline.stages
    diffusion = [s.stage_id for s in stages if s.kind == "diffusion"]
    return diffusion or [s.stage_id for s in stages if s.kind == "generation" and s.final]


def _diffusion_part(knobs: dict[str, Any]) -> dict[str, Any]:
    out = {k: knobs[k] for k in DIFFUSION_KEYS if k in knobs}
    wh = parse_size(knobs.get("size"))
    if wh is not None:
        out.setdefault("width", wh[0])
        out.setdefault("height", wh[1])
    if "n" in knobs:
        out["num_outputs_per_prompt"] = knobs["n"]
    return out


def _llm_part(knobs: dict[str, Any]) -> dict[str, Any]:
    out = {k: knobs[k] for k in LLM_KEYS if k in knobs}
    if "max_completion_tokens" in knobs and "max_tokens" not in out:
        out["max_tokens"] = knobs["max_completion_tokens"]
    return out


def with_output_resolution(prompt: dict[str, Any], knobs: dict[str, Any]) -> dict[str, Any]:
    """Put the requested output size into the prompt's ``additional_information`` too:
    a stage upstream of the denoiser (e.g. GLM-Image's AR stage, which draws the image
    tokens on a grid) must know the target resolution, and llm params cannot carry it."""
    wh = parse_size(knobs.get("size"))
    height = knobs.get("height", wh[1] if wh else None)
    width = knobs.get("width", wh[0] if wh else None)
    if height is not None and width is not None:
        info = dict(prompt.get("additional_information") or {})
        info.setdefault("height", height)
        info.setdefault("width", width)
        prompt["additional_information"] = info
    return prompt


def filter_extra_args(engine: Any, extras: dict[str, Any]) -> dict[str, Any]:
    allowed = engine.pipeline.extra_body_params or {}
    dropped = sorted(k for k in extras if k not in allowed)
    if dropped:
        logger.warning("ignoring fields not declared by pipeline %s: %s", engine.pipeline.name, ", ".join(dropped))
    return {k: v for k, v in extras.items() if k in allowed}


def _check_diffusion(partial: dict[str, Any], defaults: dict[str, Any] | None, where: str) -> None:
    try:
        if defaults is None:  # a generation stage: check only the keys we route, not its own params
            DiffusionSamplingParams.from_any({k: v for k, v in partial.items() if k in DiffusionSamplingParams.model_fields})
        else:
            DiffusionSamplingParams.from_any(partial, defaults)
    except ValueError as e:
        msg = str(e)
        raise bad_request(f"{where}{msg}", field_of(msg)) from None


def build_sampling_params_list(engine: Any, knobs: dict[str, Any], extras: dict[str, Any] | None = None,
                               explicit: list[Any] | None = None) -> list[dict[str, Any] | None]:
    stages = engine.pipeline.stages
    if explicit is not None:
        if not isinstance(explicit, list) or len(explicit) > len(stages):
            raise bad_request(f"sampling_params_list: expected at most {len(stages)} entries (one per stage)",
                              "sampling_params_list")
        for i, entry in enumerate(explicit):
            if entry is not None and not isinstance(entry, dict):
                raise bad_request(f"sampling_params_list[{i}]: expected an object or null", f"sampling_params_list[{i}]")
    given = list(explicit or []) + [None] * (len(stages) - len(explicit or []))
    targets = set(denoising_stages(engine))
    extra_args = filter_extra_args(engine, extras or {})
    defaults = engine.default_sampling_params_list
    out: list[dict[str, Any] | None] = []
    for spec in stages:
        sid = spec.stage_id
        own = dict(given[sid] or {})
        routed: dict[str, Any] = {}
        if spec.kind == "llm":
            routed = _llm_part(knobs)
        elif sid in targets:
            routed = _diffusion_part(knobs)
            if extra_args:
                routed["extra_args"] = {**extra_args, **(own.get("extra_args") or {})}
        params = {**routed, **own}
        if spec.kind == "diffusion":
            _check_diffusion(params, defaults[sid], f"stage {sid}: " if explicit else "")
        elif sid in targets:
            _check_diffusion(routed, None, "")
        out.append(params or None)
    return out


def request_knobs(body: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(standard keys, model-specific keys) from the top level and a literal nested ``extra_body``."""
    from pydantic import ValidationError

    from omnistage.server.errors import describe_validation
    from omnistage.server.protocol import GenerationKnobs

    knobs, extras = body.knobs(), body.extras()
    nested = getattr(body, "extra_body", None)
    if nested:
        try:
            inner = GenerationKnobs.model_validate(nested)
        except ValidationError as e:
            msg, param = describe_validation(list(e.errors()))
            raise bad_request(f"extra_body.{msg}", f"extra_body.{param}" if param else "extra_body") from None
        knobs.update(inner.knobs())
        extras.update(inner.extras())
    return knobs, extras
