"""Real-size random-weight folders of Qwen-Image, FLUX.1-dev and Wan2.1-T2V-14B for the second GPU check
(``gpu_evidence.py``).

Each folder starts from the family's tiny fixture (``omnistage.testing.tiny``: tokenizers, text encoders, VAE,
scheduler) and swaps in a transformer of the published shape, initialised on the device in bf16 (random init of
20B parameters is seconds on a GPU, minutes on a CPU). The numbers below are copied from each checkpoint's
``transformer/config.json`` on the Hugging Face Hub (source named per entry). One deliberate difference: the
text-projection input width (``joint_attention_dim`` / ``text_dim`` / ``pooled_projection_dim``) stays the tiny
text encoder's, because the encoders are tiny; that is one linear layer over the text tokens per forward, so the
blocks' compute, which is what batching and caching change, is the real one.

``tiny=True`` keeps the fixture's own transformer (the CPU smoke path of every preset).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class RealShape:
    builder: str  # the tiny builder (python -m omnistage.testing.tiny NAME)
    pipeline_class: str
    source: str  # where the transformer numbers come from
    transformer: dict[str, Any]
    request: dict[str, Any]  # the usual request at this size (height, width, frames, guidance)
    tiny_request: dict[str, Any]
    steps: int
    output: str  # "image" or "video"
    vae_latent_channels: int | None = None  # FLUX: the tiny VAE has 4 latent channels, the real one 16
    notes: list[str] = field(default_factory=list)


SHAPES: dict[str, RealShape] = {
    "qwen_image": RealShape(
        "qwen_image",
        "QwenImagePipeline",
        "Qwen/Qwen-Image transformer/config.json (QwenImageTransformer2DModel, ~20.4B parameters)",
        dict(
            patch_size=2,
            in_channels=64,
            out_channels=16,
            num_layers=60,
            attention_head_dim=128,
            num_attention_heads=24,
            axes_dims_rope=[16, 56, 56],
        ),
        dict(height=1024, width=1024, true_cfg_scale=1.0, max_sequence_length=64),
        dict(height=64, width=64, true_cfg_scale=1.0, max_sequence_length=16),
        steps=8,
        output="image",
        notes=["no true CFG (one row per request)"],
    ),
    "flux": RealShape(
        "flux",
        "FluxPipeline",
        "black-forest-labs/FLUX.1-dev transformer/config.json (FluxTransformer2DModel, ~11.9B parameters)",
        dict(
            patch_size=1,
            in_channels=64,
            num_layers=19,
            num_single_layers=38,
            attention_head_dim=128,
            num_attention_heads=24,
            axes_dims_rope=[16, 56, 56],
            guidance_embeds=True,
        ),
        dict(height=1024, width=1024, guidance_scale=3.5, max_sequence_length=64),
        dict(height=64, width=64, guidance_scale=3.5, max_sequence_length=16),
        steps=8,
        output="image",
        vae_latent_channels=16,
        notes=["guidance embedding, no CFG rows"],
    ),
    # the default Wan part: at 480p x 33 frames one 14B request is ~13 s of H200 time (8 steps, CFG), so the
    # 14B's full c=1/4/8 sweep does not fit one run; the 1.3B (same blocks, narrower) does
    "wan": RealShape(
        "wan",
        "WanPipeline",
        "Wan-AI/Wan2.1-T2V-1.3B-Diffusers transformer/config.json (WanTransformer3DModel, ~1.4B parameters)",
        dict(
            patch_size=[1, 2, 2],
            num_attention_heads=12,
            attention_head_dim=128,
            in_channels=16,
            out_channels=16,
            freq_dim=256,
            ffn_dim=8960,
            num_layers=30,
            cross_attn_norm=True,
            qk_norm="rms_norm_across_heads",
            eps=1e-6,
            rope_max_seq_len=1024,
        ),
        dict(height=480, width=832, num_frames=33, guidance_scale=5.0, max_sequence_length=64),
        dict(height=32, width=32, num_frames=5, guidance_scale=5.0, max_sequence_length=16),
        steps=8,
        output="video",
        notes=["480p x 33 frames, CFG (2 rows per request)"],
    ),
    # opt-in (--parts wan_14b --requests 4 --concurrency 1,4: about 5 minutes on an H200, estimated)
    "wan_14b": RealShape(
        "wan",
        "WanPipeline",
        "Wan-AI/Wan2.1-T2V-14B-Diffusers transformer/config.json (WanTransformer3DModel, ~14.3B parameters)",
        dict(
            patch_size=[1, 2, 2],
            num_attention_heads=40,
            attention_head_dim=128,
            in_channels=16,
            out_channels=16,
            freq_dim=256,
            ffn_dim=13824,
            num_layers=40,
            cross_attn_norm=True,
            qk_norm="rms_norm_across_heads",
            eps=1e-6,
            rope_max_seq_len=1024,
        ),
        dict(height=480, width=832, num_frames=33, guidance_scale=5.0, max_sequence_length=64),
        dict(height=32, width=32, num_frames=5, guidance_scale=5.0, max_sequence_length=16),
        steps=8,
        output="video",
        notes=["480p x 33 frames, CFG (2 rows per request)"],
    ),
}


# The model cards' sizes of the transformers (for sizing the scratch folder).
NOMINAL_PARAMS = {"qwen_image": 20e9, "flux": 12e9, "wan": 1.3e9, "wan_14b": 14e9}


def real_transformer(
    family: str, tiny_config: dict[str, Any], device: torch.device | str, num_layers: int | None = None
) -> torch.nn.Module:
    """The published-shape transformer, random bf16 weights made on ``device`` (``meta``: shapes only).
    ``tiny_config``: the fixture's transformer config (the keys not listed in ``SHAPES``, e.g. the text widths).
    ``num_layers`` shrinks the depth, for a cheap CPU check of this path."""
    import diffusers

    shape = SHAPES[family]
    cls = getattr(diffusers, tiny_config["_class_name"])
    cfg = {k: v for k, v in tiny_config.items() if not k.startswith("_")} | shape.transformer
    if num_layers is not None:
        cfg.update({k: num_layers for k in ("num_layers", "num_single_layers") if k in cfg})
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # made in bf16: an fp32 20B model would not fit beside its copy
    try:
        with torch.device(device):
            return cls(**cfg).eval()
    finally:
        torch.set_default_dtype(default)


def build(family: str, outdir: Path, device: torch.device, tiny: bool, num_layers: int | None = None) -> dict[str, Any]:
    """Write the family's folder; returns a description of the model."""
    import diffusers

    from omnistage.testing.tiny import build as build_tiny

    shape = SHAPES[family]
    build_tiny(shape.builder, outdir)
    config = json.loads((outdir / "transformer" / "config.json").read_text())
    desc: dict[str, Any] = {
        "family": family,
        "pipeline_class": shape.pipeline_class,
        "transformer_class": config["_class_name"],
        "tiny": tiny,
        "notes": list(shape.notes),
    }
    if tiny:
        transformer = getattr(diffusers, config["_class_name"]).from_pretrained(outdir / "transformer")
    else:
        desc.update(
            source=shape.source,
            num_layers_override=num_layers,
            text_projection_width="the tiny text encoder's (see real_shapes.py)",
        )
        transformer = real_transformer(family, config, device, num_layers)
        transformer.save_pretrained(outdir / "transformer", safe_serialization=True, max_shard_size="10GB")
        if shape.vae_latent_channels:
            from omnistage.models.flux.tiny import vae

            vae(latent_channels=shape.vae_latent_channels).save_pretrained(outdir / "vae", safe_serialization=True)
    desc["transformer_params"] = sum(p.numel() for p in transformer.parameters())
    desc["transformer_config"] = {k: v for k, v in dict(transformer.config).items() if not k.startswith("_")}
    del transformer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return desc
