"""What diffusion_batching.py runs on: a model folder and the facts its report states about one size.

Two kinds, chosen by which shapes module builds ``--family``'s folder:

- ``PresetWorkload``: a folder at one of ``sd3_shapes.PRESETS``' shapes (up to SD3-Medium's), whose forward
  timings and FLOP estimate time the transformer alone at the preset's token counts;
- ``GrownWorkload``: a registered family's tiny fixture grown by ``family_shapes.py``, timed through its
  pipeline's own transformer call; its baseline a diffusers pipeline, or a recipe of several diffusers calls behind
  one pipeline-like call (``ltx2_two_stage_recipe.py``) where the engine serves a deploy of several stages.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import family_shapes
import sd3_shapes
import torch
from batching_runs import call_kw

GUIDANCE = 5.0  # the preset workload's guidance (CFG rows double the batch)


class PresetWorkload:
    cpu_size = 64  # the tiny preset's VAE is x2: 64 px make 1024 latent pixels
    one_per_call = False
    input_image = False
    engine_pipeline = None  # the folder's own (one diffusion stage)
    stages = 1

    def __init__(self, args: Any, folder: Path, device: torch.device) -> None:
        from diffusers import StableDiffusion3Pipeline

        self.model = sd3_shapes.build(args.preset, folder, device, num_layers=args.num_layers)
        self.pipeline_class: Any = StableDiffusion3Pipeline
        msl = self.model["max_sequence_length"]
        self.knobs = {"guidance_scale": GUIDANCE, "max_sequence_length": msl}
        self.text_tokens = 77 + msl  # CLIP's 77 + T5's length, always padded to it
        self.config = {"preset": args.preset, "guidance_scale": GUIDANCE}

    def size_facts(self, pipe: Any, req: dict[str, Any], size: int, device: torch.device, dtype: torch.dtype) -> dict:
        latent_hw = size // pipe.vae_scale_factor
        tokens = (latent_hw // pipe.transformer.config.patch_size) ** 2
        text = self.text_tokens
        return {
            "image_tokens": tokens,
            "forward_ms_b2": sd3_shapes.forward_ms(pipe.transformer, latent_hw, text, 2, device, dtype),
            "forward_ms_b1": None,
            "forward_ms_b32": (
                sd3_shapes.forward_ms(pipe.transformer, latent_hw, text, 32, device, dtype, repeats=2)
                if device.type == "cuda"
                else None
            ),
            "approx_tflop_per_row": sd3_shapes.forward_tflop(pipe.transformer, tokens, text),
        }


class GrownWorkload:
    cpu_size = 128  # an x8 VAE and 2x2 packing: 128 px make 64 image tokens
    config = {"preset": None, "guidance_scale": None}

    def __init__(self, args: Any, folder: Path, device: torch.device) -> None:
        from omnistage.pipeline import resolve_pipeline

        self.model = family_shapes.build(args.family, folder)
        self.pipeline_class = baseline_class(self.model["pipeline_class"])
        self.knobs = self.model["knobs"]
        fam = family_shapes.FAMILIES[args.family]
        self.one_per_call = fam.one_per_call  # no batched diffusers call
        self.input_image, self.latent_output, self.draw_divisor = fam.input_image, fam.latent_output, fam.draw_divisor
        self.engine_pipeline = fam.engine_pipeline
        self.stages = len(resolve_pipeline(folder, fam.engine_pipeline).stages)
        self.text_tokens = self.model["max_sequence_length"]  # at most this many

    def size_facts(self, pipe: Any, req: dict[str, Any], size: int, device: torch.device, dtype: torch.dtype) -> dict:
        call = call_kw(req)
        out = "latent" if self.latent_output else "pil"
        return {
            "image_tokens": family_shapes.image_tokens(pipe, size // self.draw_divisor),
            # a pipeline of one sample per call has no batch-2 call: its lone forward instead
            "forward_ms_b2": None if self.one_per_call else family_shapes.forward_ms(pipe, call, 2, device, 3, out),
            "forward_ms_b1": family_shapes.forward_ms(pipe, call, 1, device, 3, out) if self.one_per_call else None,
            "forward_ms_b32": None,
            "approx_tflop_per_row": None,
        }


def baseline_class(name: str) -> Any:
    """A diffusers pipeline class by name, or ``module:Class`` of benchmarks/ (a recipe of several diffusers calls
    behind one pipeline-like call)."""
    import importlib

    import diffusers

    if ":" in name:
        module, cls = name.split(":")
        return getattr(importlib.import_module(module), cls)
    return getattr(diffusers, name)


def workload_class(family: str) -> type[PresetWorkload] | type[GrownWorkload]:
    return PresetWorkload if family == sd3_shapes.FAMILY else GrownWorkload


def families() -> list[str]:
    """What ``--family`` takes: the preset-shaped family, then every family family_shapes.py grows."""
    return [sd3_shapes.FAMILY, *family_shapes.FAMILIES]
