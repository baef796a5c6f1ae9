"""Tiny Qwen-Image-Layered folder: real classes (QwenImageTransformer2DModel with the layered RoPE and the RGBA
timestep condition, a Qwen2.5-VL text encoder and Qwen2-VL processor, an RGBA AutoencoderKLQwenImage), random
weights, Qwen-Image's locally trained tokenizer.

The pipeline resizes the input image to about 640x640 pixels (or 1024x1024) whatever its size, so the VAE here is
x32 with no residual blocks: each layer is 10x10 packed tokens at 640 px, and a request of N layers denoises
N + 1 of them beside the input image's."""

from __future__ import annotations

from pathlib import Path

from omnistage.models.shared.tiny.qwen_image import SCHEDULER, tokenizer, transformer, vae
from omnistage.models.shared.tiny.qwen_vl import processor, text_encoder


def build(outdir: Path, *, seed: int = 0) -> None:
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImageLayeredPipeline

    tok = tokenizer()
    pipe = QwenImageLayeredPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
        vae=vae(stages=6, res_blocks=0, channels=4, seed=seed),
        text_encoder=text_encoder(tok, seed),
        tokenizer=tok,
        processor=processor(tok),
        transformer=transformer(seed=seed, use_additional_t_cond=True, use_layer3d_rope=True),
    )
    pipe.save_pretrained(outdir, safe_serialization=True)
