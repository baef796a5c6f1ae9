"""The other image families of the batching benchmark (``diffusion_batching.py --family``): random-weight
folders from each family's tiny builder (``omnistage.testing.tiny``: its text encoders, tokenizers, VAE and
scheduler) with the transformer swapped for a wider, deeper one of the same class, so that its forward, not
Python, is what a step costs (a few ms per forward on one CPU thread); and the request knobs each family is
served with.

SD3 keeps its own presets in ``sd3_shapes.py``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class FamilyBench:
    name: str  # the tiny builder's name (``python -m omnistage.testing.tiny NAME``)
    pipeline_class: str  # the diffusers pipeline the baselines call
    transformer: dict[str, Any] = field(default_factory=dict)  # transformer config keys that grow it
    knobs: dict[str, Any] = field(default_factory=dict)  # per-request parameters besides size / steps / prompt
    note: str = ""
    text_tokens: int | None = None  # a fixed text length where the family has no max_sequence_length knob
    # diffusers' pipeline makes one sample per call (a prompt list is cut to its first): there is no batched
    # diffusers call to compare with, so the benchmark runs no "ideal" baseline for it
    one_per_call: bool = False
    # every request carries an RGBA input image of size x size (diffusers' ``image=``, the engine's
    # ``multi_modal_data``) and no height / width: the pipeline sizes its output from the image
    input_image: bool = False
    # diffusers' __call__ can stop at ``output_type="latent"`` (the forward timing's call skips the decode)
    latent_output: bool = True
    # the omnistage pipeline the engine serves (a deploy of the family by name); None: the folder's own
    engine_pipeline: str | None = None
    # the first pass draws at size // this (the report's image tokens and forward are that pass's)
    draw_divisor: int = 1


# the tiny LTX-2 DiT grown for both LTX-2 rows (one stage, and the two-stage deploy)
LTX2_GROWN = dict(
    num_layers=4,
    num_attention_heads=4,
    attention_head_dim=32,
    cross_attention_dim=128,
    audio_num_attention_heads=4,
    audio_attention_head_dim=16,
    audio_cross_attention_dim=64,
)

FAMILIES: dict[str, FamilyBench] = {
    "flux": FamilyBench(
        "flux",
        "FluxPipeline",
        dict(
            num_layers=4, num_single_layers=4, num_attention_heads=4, attention_head_dim=32, axes_dims_rope=[8, 12, 12]
        ),
        dict(guidance_scale=3.5, max_sequence_length=64),
        "FLUX.1-dev layout: guidance embedding (no CFG rows), T5 length 64",
    ),
    "z_image": FamilyBench(
        "z_image",
        "ZImagePipeline",
        dict(n_layers=8, n_refiner_layers=1, n_heads=4, n_kv_heads=4, dim=128, axes_dims=[8, 12, 12]),
        dict(guidance_scale=0.0, max_sequence_length=64),
        "Z-Image-Turbo usage: no CFG; captions of their own lengths in one forward",
    ),
    "qwen_image": FamilyBench(
        "qwen_image",
        "QwenImagePipeline",
        dict(num_layers=8, num_attention_heads=4, attention_head_dim=32, axes_dims_rope=[8, 12, 12]),
        dict(true_cfg_scale=1.0, max_sequence_length=64),
        "no true CFG",
    ),
    "flux2_klein": FamilyBench(
        "flux2_klein",
        "Flux2KleinPipeline",
        dict(
            num_layers=4, num_single_layers=4, num_attention_heads=4, attention_head_dim=32, axes_dims_rope=[8, 8, 8, 8]
        ),
        dict(guidance_scale=1.0, max_sequence_length=64),
        "FLUX.2 [klein], distilled usage: no CFG rows",
    ),
    "flux2": FamilyBench(
        "flux2",
        "Flux2Pipeline",
        dict(
            num_layers=4, num_single_layers=4, num_attention_heads=4, attention_head_dim=32, axes_dims_rope=[8, 8, 8, 8]
        ),
        dict(guidance_scale=4.0, max_sequence_length=64),
        "FLUX.2 [dev]: guidance embedding (no CFG rows); the system turn takes ~40 of the 64 text tokens",
    ),
    "qwen_image_layered": FamilyBench(
        "qwen_image_layered",
        "QwenImageLayeredPipeline",
        dict(num_layers=8, num_attention_heads=4, attention_head_dim=32, axes_dims_rope=[8, 12, 12]),
        dict(true_cfg_scale=1.0, max_sequence_length=64, extra_args=dict(layers=2)),
        "no true CFG; each request decomposes its own RGBA noise image (the pipeline resizes it to a 640x640 "
        "area, so --sizes only sets the upload) into 2 layers: 3 latent frames beside the image's tokens; the "
        "ideal call takes the prompts and images as lists (diffusers 0.42.1 then deals the decoded layers out to "
        "the wrong rows, slicing by layers + 1: the same work, misfiled)",
        input_image=True,
        latent_output=False,  # QwenImageLayeredPipeline 0.42.1's output_type="latent" raises after the loop
    ),
    "qwen_image_21": FamilyBench(
        "qwen_image_21",
        "QwenImage21Pipeline",
        dict(num_layers=8, num_attention_heads=4, attention_head_dim=32, axes_dims_rope=[8, 12, 12]),
        dict(true_cfg_scale=1.0),
        "no true CFG; only prompts of one token length share a forward (RoPE puts the "
        "image after the text), so the benchmark's 8 prompts of 6 lengths batch in groups; the ideal call pads "
        "them (diffusers' own batch, which moves the image's positions)",
    ),
    "ovis_image": FamilyBench(
        "ovis_image",
        "OvisImagePipeline",
        dict(
            num_layers=4, num_single_layers=4, num_attention_heads=4, attention_head_dim=32, axes_dims_rope=[8, 12, 12]
        ),
        dict(guidance_scale=5.0, max_sequence_length=64),
        "OvisImagePipeline's default CFG (5: a cond and an uncond forward each step), Qwen3 text length 64",
    ),
    "longcat_image": FamilyBench(
        "longcat_image",
        "LongCatImagePipeline",
        dict(
            num_layers=4, num_single_layers=4, num_attention_heads=4, attention_head_dim=32, axes_dims_rope=[8, 12, 12]
        ),
        dict(guidance_scale=4.5, extra_args=dict(enable_prompt_rewrite=False)),
        "LongCatImagePipeline's default CFG (4.5, with its CFG renorm); every prompt padded to 512 text tokens; "
        "prompt rewriting off (the engine's default; diffusers' is on)",
        text_tokens=512,
    ),
    "ernie_image": FamilyBench(
        "ernie_image",
        "ErnieImagePipeline",
        dict(hidden_size=128, num_attention_heads=4, num_layers=8, ffn_hidden_size=256, rope_axes_dim=(8, 12, 12)),
        dict(guidance_scale=4.0, extra_args=dict(use_pe=False)),
        "ErnieImagePipeline's default CFG (4.0: a cond and an uncond row each step); prompts at their own token "
        "lengths in one forward (masked); the prompt enhancer off (a whole LLM generation per request, not batched)",
    ),
    "sana": FamilyBench(
        "sana",
        "SanaPipeline",
        dict(
            num_layers=4,
            num_attention_heads=4,
            attention_head_dim=32,
            num_cross_attention_heads=4,
            cross_attention_head_dim=32,
            cross_attention_dim=128,
        ),
        dict(guidance_scale=4.5, extra_args=dict(use_resolution_binning=False)),
        "SanaPipeline's default CFG (4.5); the requested size (no resolution binning); DC-AE x32: 128 px are 4x4 "
        "latent tokens",
    ),
    "pixart_sigma": FamilyBench(
        "pixart_sigma",
        "PixArtSigmaPipeline",
        dict(num_layers=4, num_attention_heads=4, attention_head_dim=32, cross_attention_dim=128),
        dict(guidance_scale=4.5, extra_args=dict(use_resolution_binning=False)),
        "PixArtSigmaPipeline's default CFG (4.5); the requested size (no resolution binning)",
    ),
    "ltx2": FamilyBench(
        "ltx2",
        "LTX2Pipeline",
        LTX2_GROWN,
        dict(guidance_scale=3.0, num_frames=9, max_sequence_length=64),
        "LTX2Pipeline's defaults: CFG (video 3, audio 7), STG and modality-isolation forwards, rescale; 9 frames "
        "+ their audio (run with --sizes 32: this VAE compresses space by 2 only)",
    ),
    "ltx2_two_stage": FamilyBench(
        "ltx2",
        "ltx2_two_stage_recipe:LTX2TwoStageRecipe",
        LTX2_GROWN,
        dict(
            guidance_scale=3.0,
            num_frames=9,
            max_sequence_length=64,
            extra_args=dict(spatio_temporal_guidance_blocks=[1]),
        ),
        "the two-stage deploy (first pass -> latent upsampler + 3-step refine pass, two diffusion stages) against "
        "diffusers' published recipe (ltx2_two_stage_recipe.py; the ideal runs each of its three calls once per "
        "batch); the first pass at half the size with LTX2Pipeline's CFG, STG (block 1 of the 4) and "
        "modality-isolation forwards; the refine pass unguided (scale 1); 9 frames + their audio (run with "
        "--sizes 64: the final video's; image tokens and forward below are the first pass's); the engine's two "
        "stages step in threads of their own, so on 2+ cores one request's refine pass may overlap another's first "
        "pass, which the recipe's calls cannot: the CPU-time ratios compare the work alone",
        engine_pipeline="ltx2_two_stage",
        draw_divisor=2,
    ),
    "hunyuan_video15": FamilyBench(
        "hunyuan_video15",
        "HunyuanVideo15Pipeline",
        dict(num_layers=4, num_attention_heads=4, attention_head_dim=32, rope_axes_dim=(8, 12, 12)),
        dict(num_frames=5, output_type="latent"),
        "the folder's CFG guider (scale 6: cond and uncond forwards each step); 5 frames (run with --sizes 32: "
        "this VAE compresses space by 4); latents out in every mode: diffusers' AutoencoderKLHunyuanVideo15 "
        "cannot decode a batch of two or more (its causal attention mask does not broadcast), so the ideal "
        "batched call could not decode",
    ),
    "helios": FamilyBench(
        "helios",
        "HeliosPipeline",
        dict(num_layers=4, num_attention_heads=4, attention_head_dim=32, rope_dim=(8, 12, 12), ffn_dim=128),
        dict(guidance_scale=5.0, num_frames=65, max_sequence_length=64),
        "HeliosPipeline's default CFG (5: cond and uncond forwards each step); 65 frames = two chunks of 9 latent "
        "frames, the second on the first's history (run with --sizes 32)",
    ),
    "cosmos3": FamilyBench(
        "cosmos3",
        "Cosmos3OmniPipeline",
        dict(
            hidden_size=128,
            head_dim=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=256,
            num_hidden_layers=4,
            rope_axes_dim=(8, 4, 4),
        ),
        dict(guidance_scale=6.0, num_frames=9),
        "Cosmos3OmniPipeline's default CFG (6: a cond and an uncond transformer call each step); 9 frames; its "
        "transformer takes one packed sequence (no batch axis), so the engine shares step boundaries, not forwards, "
        "and diffusers has no batched call (one sample per __call__): engine vs sequential only",
        one_per_call=True,
    ),
    "wan_vace": FamilyBench(
        "wan_vace",
        "WanVACEPipeline",
        dict(num_layers=4, num_attention_heads=4, attention_head_dim=32, ffn_dim=128, vace_layers=[0, 2]),
        dict(guidance_scale=5.0, num_frames=9, max_sequence_length=64),
        "WanVACEPipeline's default CFG (5: cond and uncond forwards each step); 9 frames from the prompt alone (the "
        "pipeline's all-zero control video, whose VACE hints every forward still computes); diffusers takes one "
        "prompt per __call__ (a list is refused), so there is no batched call: engine vs sequential only",
        one_per_call=True,
    ),
}


def available() -> list[str]:
    """The families whose tiny builders exist in this checkout."""
    from omnistage.testing.tiny import builders

    known = builders()
    return [name for name, fam in FAMILIES.items() if fam.name in known]


def build(family: str, outdir: Path) -> dict[str, Any]:
    """Write the family's benchmark folder; returns a description of the model."""
    import json

    import diffusers

    from omnistage.testing.tiny import build as build_tiny

    fam = FAMILIES[family]
    build_tiny(fam.name, outdir)
    folder = outdir / "transformer"
    config = json.loads((folder / "config.json").read_text())
    cls = getattr(diffusers, config["_class_name"])
    cfg = {k: v for k, v in config.items() if not k.startswith("_")} | fam.transformer
    torch.manual_seed(0)
    transformer = cls(**cfg).eval()
    transformer.save_pretrained(folder, safe_serialization=True)
    return {
        "family": family,
        "pipeline_class": fam.pipeline_class,
        "transformer_class": cls.__name__,
        "transformer_overrides": dict(fam.transformer),
        "transformer_params": sum(p.numel() for p in transformer.parameters()),
        "knobs": dict(fam.knobs),
        "note": fam.note,
        "max_sequence_length": fam.knobs.get("max_sequence_length", fam.text_tokens),
    }


def image_tokens(pipe: Any, size: int) -> int:
    """Image tokens per row at a square ``size``: the image families pack 2x2 latent patches (Sana: 1x1); LTX-2's video
    tokens are its latent pixels of every latent frame (9 frames here), HunyuanVideo-1.5's too (1x1 patches in
    the tiny fixture); Helios' are one chunk's 9 latent frames in 2x2 patches (its history tokens come on top)."""
    name = type(pipe).__name__
    if name == "SanaPipeline":  # DC-AE latents in 1x1 patches
        return (size // pipe.vae_scale_factor) ** 2
    if name == "ErnieImagePipeline":  # its VAE factor (16) already counts the 2x2 patches; 1x1 tokens
        return (size // pipe.vae_scale_factor) ** 2
    if name == "HeliosPipeline":
        return 9 * (size // (pipe.vae_scale_factor_spatial * 2)) ** 2
    if name == "QwenImageLayeredPipeline":  # every latent frame (the layers + the composite) and the image's own
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_layered import calculate_dimensions

        w, h = calculate_dimensions(640 * 640, 1.0)  # the pipeline's default area at the square upload's aspect
        per_frame = (h // (pipe.vae_scale_factor * 2)) * (w // (pipe.vae_scale_factor * 2))
        return (FAMILIES["qwen_image_layered"].knobs["extra_args"]["layers"] + 2) * per_frame
    if name == "WanVACEPipeline":  # 2x2 patches of every latent frame (4x temporal compression)
        frames = (FAMILIES["wan_vace"].knobs["num_frames"] - 1) // pipe.vae_scale_factor_temporal + 1
        return frames * (size // (pipe.vae_scale_factor_spatial * 2)) ** 2
    if name == "Cosmos3OmniPipeline":  # 2x2 patches of every latent frame (4x temporal compression)
        frames = (FAMILIES["cosmos3"].knobs["num_frames"] - 1) // pipe.vae_scale_factor_temporal + 1
        return frames * (size // (pipe.vae_scale_factor_spatial * 2)) ** 2
    if name == "HunyuanVideo15Pipeline":
        frames = (FAMILIES["hunyuan_video15"].knobs["num_frames"] - 1) // pipe.vae_scale_factor_temporal + 1
        return frames * (size // pipe.vae_scale_factor_spatial) ** 2
    if hasattr(pipe, "vae_spatial_compression_ratio"):
        frames = (FAMILIES["ltx2"].knobs["num_frames"] - 1) // pipe.vae_temporal_compression_ratio + 1
        return frames * (size // pipe.vae_spatial_compression_ratio) ** 2
    return (size // (pipe.vae_scale_factor * 2)) ** 2


def forward_ms(
    pipe: Any, call: dict[str, Any], rows: int, device: torch.device, repeats: int = 3, output_type: str = "latent"
) -> float:
    """Mean transformer forward time (ms) inside a 2-step diffusers call of ``rows`` prompts, timed by
    hooks on the transformer (family-agnostic; the first call warms up). ``output_type``: "latent" skips the
    decode, where the pipeline can stop there."""
    times: list[float] = []
    start: list[float] = []

    def pre(*_: Any, **__: Any) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start.append(time.perf_counter())

    def post(*_: Any, **__: Any) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start[-1])

    kw = {**call, "num_inference_steps": 2, "output_type": output_type}
    prompt = ["a red cat"] * rows if rows > 1 else "a red cat"  # (one string: a pipeline that refuses lists)
    hooks = [pipe.transformer.register_forward_pre_hook(pre), pipe.transformer.register_forward_hook(post)]
    try:
        pipe(prompt=prompt, **kw)
        times.clear()
        for _ in range(repeats):
            pipe(prompt=prompt, **kw)
    finally:
        for h in hooks:
            h.remove()
    return sum(times) / len(times) * 1000
