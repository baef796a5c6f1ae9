"""SD3 model folders of a chosen shape, random weights, for the batching benchmark.

Starts from the test suite's tiny SD3 folder (``omnistage.testing.tiny``: locally
trained tokenizers, scheduler) and swaps in components of the preset's shape:

- ``tiny``: the CPU benchmark's model (4 MMDiT layers, 4 heads x 32, patch 2; tiny VAE and text encoders).
- ``wide``: the same, 4 heads x 64 (the CPU model of ``diffusion_parallel.py``).
- ``sd3-medium``: Stable Diffusion 3 Medium's MMDiT and VAE configs (24 layers x 1536 wide, patch 2,
  16 latent channels, ~2B transformer parameters) with tiny text encoders of the real output widths
  (CLIP pooled 2 x 1024, T5 4096): prompt encoding is a one-off per request, the denoising loop is
  what step-level batching changes.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

FAMILY = "sd3"  # the registered family whose pipeline these presets shape
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "transformer": dict(num_layers=4, num_attention_heads=4, attention_head_dim=32, caption_projection_dim=128),
        "max_sequence_length": 32,
    },
    # diffusion_parallel.py on CPU: 4x the tiny one's compute per token, so a forward, not the ranks' messages,
    # is what a step costs
    "wide": {
        "transformer": dict(num_layers=4, num_attention_heads=4, attention_head_dim=64, caption_projection_dim=256),
        "max_sequence_length": 32,
    },
    # stabilityai/stable-diffusion-3-medium-diffusers: transformer/config.json and vae/config.json
    "sd3-medium": {
        "transformer": dict(
            num_layers=24,
            num_attention_heads=24,
            attention_head_dim=64,
            caption_projection_dim=1536,
            in_channels=16,
            out_channels=16,
            joint_attention_dim=4096,
            pooled_projection_dim=2048,
            patch_size=2,
            pos_embed_max_size=192,
            sample_size=128,
        ),
        "vae": dict(
            block_out_channels=(128, 256, 512, 512),
            in_channels=3,
            out_channels=3,
            latent_channels=16,
            down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4,
            layers_per_block=2,
            norm_num_groups=32,
            sample_size=1024,
            scaling_factor=1.5305,
            shift_factor=0.0609,
            use_quant_conv=False,
            use_post_quant_conv=False,
        ),
        "clip_projection_dim": 1024,  # CLIP-L 768 + CLIP-G 1280 in the real model: pooled width 2048
        "t5_d_model": 4096,
        "max_sequence_length": 256,  # StableDiffusion3Pipeline's default
        "save_dtype": torch.bfloat16,  # halves the folder (~4 GB); the benchmark runs it in bf16
    },
}


def build(preset: str, outdir: Path, device: torch.device, num_layers: int | None = None) -> dict[str, Any]:
    """Write the preset's diffusers folder to ``outdir``; returns a description of the model.

    ``device``: where weights are initialised (random init of 2B parameters is seconds on a GPU).
    ``num_layers`` overrides the preset's depth (for a cheap CPU check of the real-size code path)."""
    from diffusers import AutoencoderKL, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextModelWithProjection, T5EncoderModel

    from omnistage.testing.tiny import build as build_tiny

    spec = PRESETS[preset]
    with tempfile.TemporaryDirectory() as tmp:
        base = StableDiffusion3Pipeline.from_pretrained(build_tiny("sd3", Path(tmp) / "sd3"))
    torch.manual_seed(0)
    cfg = {**dict(base.transformer.config), **spec["transformer"]}
    if num_layers is not None:
        cfg["num_layers"] = num_layers
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}
    with torch.device(device):
        transformer = SD3Transformer2DModel(**cfg).eval()
        vae = AutoencoderKL(**spec["vae"]).eval() if "vae" in spec else base.vae
    parts = dict(text_encoder=base.text_encoder, text_encoder_2=base.text_encoder_2, text_encoder_3=base.text_encoder_3)
    if "clip_projection_dim" in spec:
        for name in ("text_encoder", "text_encoder_2"):
            c = type(base.text_encoder.config)(
                **{**base.text_encoder.config.to_dict(), "projection_dim": spec["clip_projection_dim"]}
            )
            parts[name] = CLIPTextModelWithProjection(c).eval()
        t5 = type(base.text_encoder_3.config)(**{**base.text_encoder_3.config.to_dict(), "d_model": spec["t5_d_model"]})
        parts["text_encoder_3"] = T5EncoderModel(t5).eval()
    pipe = StableDiffusion3Pipeline(
        transformer=transformer,
        vae=vae,
        scheduler=base.scheduler,
        tokenizer=base.tokenizer,
        tokenizer_2=base.tokenizer_2,
        tokenizer_3=base.tokenizer_3,
        **parts,
    )
    pipe.to("cpu", spec.get("save_dtype", torch.float32))
    outdir.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(outdir, safe_serialization=True)
    n_params = sum(p.numel() for p in transformer.parameters())
    return {
        "preset": preset,
        "transformer_params": n_params,
        "transformer_config": _jsonable(cfg),
        "vae_block_out_channels": list(vae.config.block_out_channels),
        "vae_scale_factor": pipe.vae_scale_factor,
        "latent_channels": vae.config.latent_channels,
        "max_sequence_length": spec["max_sequence_length"],
        "saved_dtype": str(spec.get("save_dtype", torch.float32)).removeprefix("torch."),
        "folder_bytes": sum(f.stat().st_size for f in outdir.rglob("*") if f.is_file()),
    }


def work_dir(need_bytes: int) -> str:
    """A RAM-backed scratch folder when it has room (the real-size folder is written once and read twice)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and shutil.disk_usage(shm).free > 2 * need_bytes:
        return tempfile.mkdtemp(prefix="omnistage-bench-", dir=shm)
    return tempfile.mkdtemp(prefix="omnistage-bench-")


def forward_tflop(transformer: torch.nn.Module, image_tokens: int, text_tokens: int) -> float:
    """Approximate TFLOP of one MMDiT forward for one row: 2 x (per-token linear weights) x tokens, plus
    the joint attention's two N x N products. The adaLN linears act once per sample and are left out."""
    img = txt = 0
    for name, m in transformer.transformer_blocks.named_modules():
        parts = name.split(".")
        if not isinstance(m, torch.nn.Linear) or any(p.startswith("norm") for p in parts):
            continue  # adaLN modulation: once per sample, not per token
        if "ff_context" in parts or any(p.startswith("add_") or p == "to_add_out" for p in parts):
            txt += m.weight.numel()
        else:
            img += m.weight.numel()
    cfg = transformer.config
    n = image_tokens + text_tokens
    attn = 4 * n * n * cfg.num_attention_heads * cfg.attention_head_dim * cfg.num_layers
    return (2 * (img * image_tokens + txt * text_tokens) + attn) / 1e12


def forward_ms(
    transformer: torch.nn.Module,
    latent_hw: int,
    text_tokens: int,
    rows: int,
    device: torch.device,
    dtype: torch.dtype,
    repeats: int = 5,
) -> float:
    """One transformer forward at the benchmark shape (ms, after one warm-up call)."""
    cfg = transformer.config
    x = torch.randn(rows, cfg.in_channels, latent_hw, latent_hw, device=device, dtype=dtype)
    txt = torch.randn(rows, text_tokens, cfg.joint_attention_dim, device=device, dtype=dtype)
    pooled = torch.randn(rows, cfg.pooled_projection_dim, device=device, dtype=dtype)
    t = torch.full((rows,), 500.0, device=device, dtype=dtype)
    with torch.no_grad():
        transformer(hidden_states=x, timestep=t, encoder_hidden_states=txt, pooled_projections=pooled)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        s = time.perf_counter()
        for _ in range(repeats):
            transformer(hidden_states=x, timestep=t, encoder_hidden_states=txt, pooled_projections=pooled)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return (time.perf_counter() - s) / repeats * 1000


def _jsonable(cfg: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (list(v) if isinstance(v, tuple) else v)
        for k, v in cfg.items()
        if isinstance(v, (int, float, str, bool, tuple, list, type(None)))
    }
