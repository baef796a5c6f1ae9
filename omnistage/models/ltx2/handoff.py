"""What the two-stage LTX-2 deploy hands from its first pass to its refine pass, and how a request's parameters are
split between the two (no torch at import: the declaration imports this module).

The published recipe runs ``LTX2Pipeline(output_type="latent")``, upsamples the video latents 2x with
``LTX2LatentUpsamplePipeline``, and refines them with a short ``LTX2Pipeline`` call on its own sigmas, the same
``generator`` running through both calls. ``LTX2Latents`` is exactly what crosses between the calls: the video and
audio latents as the first call returns them, and the generator's state after it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import partial
from pathlib import Path
from typing import Any

from omnistage.errors import InvalidRequestError

UPSAMPLER_FOLDER = "latent_upsampler"  # where the release keeps the upsampler, beside the pipeline's components
SIZE_STEP = 32  # LTX2Pipeline.check_inputs: height and width are multiples of 32
# what the refine pass draws with as the first pass did (its steps, sigmas and guidance_scale are its own)
CARRIED = ("negative_prompt", "seed", "fps", "max_sequence_length", "cache")


@dataclass
class LTX2Latents:
    """The first pass's output: ``video`` [1, C, F, H, W] and ``audio`` [1, C, L, mel bins], both in their VAEs'
    units (as ``LTX2Pipeline(output_type="latent")`` returns them), and ``generator`` (``torch.Generator.get_state()``
    after the pass: the refine pass draws its noise from where the first one stopped)."""

    video: Any
    audio: Any
    generator: Any

    @classmethod
    def from_any(cls, value: Any) -> LTX2Latents:
        """The payload as sent: itself in one process, a dict of its fields after crossing to a stage process."""
        if isinstance(value, cls):
            return value
        if isinstance(value, Mapping) and {"video", "audio", "generator"} <= set(value):
            return cls(value["video"], value["audio"], value["generator"])
        raise TypeError(f"the refine pass takes the first pass's LTX2Latents, got {type(value).__name__}")

    def new_generator(self) -> Any:
        import torch

        g = torch.Generator("cpu")  # the diffusion engine's request generators are CPU ones
        g.set_state(self.generator)
        return g


def one_payload(parts: list[Any]) -> Any:
    """The first pass's output is one ``LTX2Latents`` (an accumulation rule: module level, so it pickles)."""
    return parts[-1]


def to_refine_pass(source: dict[str, Any], request: Any) -> dict[str, Any]:
    """Edge 0 -> 1: the prompt (and a negative one sent with it) and the first pass's latents."""
    prompt = request.prompt
    out = {"prompt": prompt["prompt"], "latents": source["latent"]}
    if "negative_prompt" in prompt:
        out["negative_prompt"] = prompt["negative_prompt"]
    return out


def upsampler_scale(folder: Path) -> Fraction:
    """The folder's latent upsampler's spatial factor (2 when it has none: the refine stage then fails to start,
    naming the missing folder)."""
    path = Path(folder) / UPSAMPLER_FOLDER / "config.json"
    cfg = json.loads(path.read_text()) if path.is_file() else {}
    if not cfg.get("use_rational_resampler", True):
        return Fraction(2)
    return Fraction(cfg.get("rational_spatial_scale", 2.0)).limit_denominator(8)


def split_params(prompt: dict[str, Any], params: list[Any], scale: Fraction = Fraction(2)) -> None:
    """A request's parameters, as the two passes take them: its size is the video's, so the first pass draws at
    1/scale of it; the refine pass draws with the first pass's prompt settings, frame rate and model-specific
    guidance (unless its own ``sampling_params_list`` entry says otherwise)."""
    first, refine = params
    if not isinstance(first, dict) or not isinstance(refine, dict):
        return  # an engine's own params object: taken as it is
    if first.get("output_type", "latent") != "latent":
        raise InvalidRequestError("output_type", "the first pass of the two-stage deploy hands on its latents")
    step = SIZE_STEP * scale.numerator
    for name in ("height", "width"):
        value = first.get(name)
        if value is None:
            continue  # the pipeline's default (512x768) for the first pass: a video of twice that
        if value % step:
            raise InvalidRequestError(
                name, f"{value} is not divisible by {step} (the first pass draws at 1/{scale} of it, in {SIZE_STEP}s)"
            )
        first[name] = value * scale.denominator // scale.numerator
    for key in CARRIED:
        if key in first and key not in refine:
            refine[key] = first[key]
    refine["extra_args"] = {**(first.get("extra_args") or {}), **(refine.get("extra_args") or {})}


def split_params_for(folder: Path) -> Any:
    return partial(split_params, scale=upsampler_scale(folder))
