"""Tiny Sana folder: real classes (SanaTransformer2DModel, Gemma-2, AutoencoderDC, flow DPM-Solver++),
random weights."""

from __future__ import annotations

from pathlib import Path

from omnistage.models.shared.tiny.sizes import decoder
from omnistage.stages.diffusion import tiny_parts as parts


def tokenizer(vocab_size: int = 300):
    from transformers import GemmaTokenizer

    return GemmaTokenizer().train_new_from_iterator(parts._CORPUS * 4, vocab_size=vocab_size)


def text_encoder(vocab_size: int, hidden: int = 32):
    from transformers import Gemma2Config, Gemma2Model

    # long positions: the prompt is prefixed with the pipeline's complex_human_instruction, which a tiny
    # vocabulary splits into many tokens
    return Gemma2Model(Gemma2Config(**decoder(vocab_size, hidden, head_dim=16, max_positions=8192))).eval()


def transformer(*, sample_size: int = 16, caption_dim: int = 32):
    from diffusers import SanaTransformer2DModel

    # sample size 16 selects diffusers' 512-pixel resolution bins (Sana-600M-512px's)
    return SanaTransformer2DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=8,
        num_layers=1,
        num_cross_attention_heads=2,
        cross_attention_head_dim=8,
        cross_attention_dim=16,
        caption_channels=caption_dim,
        sample_size=sample_size,
        patch_size=1,
    ).eval()


def vae():
    from diffusers import AutoencoderDC

    # six stages: DC-AE's spatial factor 32 (sizes are multiples of 32); attention only in the deepest ones
    return AutoencoderDC(
        latent_channels=4,
        attention_head_dim=4,
        encoder_block_out_channels=(4, 4, 4, 8, 8, 8),
        decoder_block_out_channels=(4, 4, 4, 8, 8, 8),
        encoder_layers_per_block=(1,) * 6,
        decoder_layers_per_block=(1,) * 6,
        encoder_block_types=("ResBlock",) * 3 + ("EfficientViTBlock",) * 3,
        decoder_block_types=("ResBlock",) * 3 + ("EfficientViTBlock",) * 3,
        encoder_qkv_multiscales=((),) * 3 + ((5,),) * 3,
        decoder_qkv_multiscales=((),) * 3 + ((5,),) * 3,
        scaling_factor=0.41407,
    ).eval()


def build(outdir: Path) -> None:
    """Write a loadable SanaPipeline folder (Sana-1.0 layout: flow-matching DPM-Solver++ with shift 3)."""
    import torch
    from diffusers import DPMSolverMultistepScheduler, SanaPipeline

    torch.manual_seed(0)
    tok = tokenizer()
    scheduler = DPMSolverMultistepScheduler(flow_shift=3.0, use_flow_sigmas=True, prediction_type="flow_prediction")
    pipe = SanaPipeline(
        tokenizer=tok, text_encoder=text_encoder(len(tok)), vae=vae(), transformer=transformer(), scheduler=scheduler
    )
    pipe.save_pretrained(outdir, safe_serialization=True)


# the self- (linear) and cross-attention projections of every block
LORA_TARGETS = r"transformer_blocks\.\d+\.attn[12]\.(to_q|to_k|to_v|to_out\.0)"


def build_lora(outdir: Path, *, seed: int = 0, rank: int = 4) -> None:
    """A LoRA for the model ``build`` writes: random non-zero A and B (no alphas: Sana's loader takes PEFT keys
    only, so the scaling is 1)."""
    from diffusers import SanaPipeline

    from omnistage.stages.diffusion.tiny_lora import random_lora, save

    save(SanaPipeline, Path(outdir), random_lora(transformer(), LORA_TARGETS, rank, seed))
