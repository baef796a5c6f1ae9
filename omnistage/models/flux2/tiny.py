"""Tiny FLUX.2 [klein] folder: real classes (Flux2Transformer2DModel, Qwen3 causal LM, AutoencoderKLFlux2),
random weights."""

from __future__ import annotations

from pathlib import Path

from omnistage.models.shared.tiny import mistral3
from omnistage.models.shared.tiny.flux2_vae import vae
from omnistage.models.shared.tiny.sizes import decoder

# FLUX.2 [klein]'s scheduler config (the shift exponent mu comes from the pipeline's empirical rule)
SCHEDULER = dict(
    shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096
)
TEXT_LAYERS = 27  # the pipeline stacks hidden states 9, 18 and 27


def text_encoder(vocab_size: int, hidden: int = 16):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(**decoder(vocab_size, hidden, layers=TEXT_LAYERS, head_dim=8))
    return Qwen3ForCausalLM(cfg).eval()


def transformer(*, text_dim: int, latent_channels: int = 4, guidance_embeds: bool = False):
    from diffusers import Flux2Transformer2DModel

    # RoPE over four axes (T, H, W, L) splitting the head dim equally, as FLUX.2's (32, 32, 32, 32)
    return Flux2Transformer2DModel(
        patch_size=1,
        in_channels=latent_channels * 4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=3 * text_dim,
        timestep_guidance_channels=32,
        axes_dims_rope=(4, 4, 4, 4),
        guidance_embeds=guidance_embeds,
    ).eval()


def build_klein(outdir: Path) -> None:
    """A Flux2KleinPipeline folder, not distilled (CFG when guidance_scale > 1); sizes are multiples of 16."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline

    from omnistage.models.shared.tiny.qwen3 import tokenizer

    torch.manual_seed(0)
    tok = tokenizer()
    encoder = text_encoder(len(tok))
    pipe = Flux2KleinPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
        vae=vae(),
        text_encoder=encoder,
        tokenizer=tok,
        transformer=transformer(text_dim=encoder.config.hidden_size),
        is_distilled=False,
    )
    pipe.save_pretrained(outdir, safe_serialization=True)


def mistral_processor(vocab_size: int = 400):
    """A PixtralProcessor (FLUX.2 [dev]'s text encoder is Mistral Small 3.1 behind one) around a locally trained
    tokenizer; the corpus includes the pipeline's system message so that it stays a few dozen tokens (it precedes
    every prompt)."""
    from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE
    from transformers import PixtralImageProcessor, PixtralProcessor

    tok = mistral3.tokenizer(vocab_size, extra_corpus=[SYSTEM_MESSAGE])
    return PixtralProcessor(
        image_processor=PixtralImageProcessor(patch_size=8),
        tokenizer=tok,
        patch_size=8,
        chat_template=mistral3.TEMPLATE,
    )


def build_dev(outdir: Path) -> None:
    """A Flux2Pipeline folder (FLUX.2 [dev]: Mistral3 text encoder, guidance-distilled: the guidance embedding);
    sizes are multiples of 16."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2Pipeline

    torch.manual_seed(0)
    processor = mistral_processor()
    encoder = mistral3.encoder(len(processor.tokenizer))
    pipe = Flux2Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
        vae=vae(),
        text_encoder=encoder,
        tokenizer=processor,
        transformer=transformer(text_dim=encoder.config.text_config.hidden_size, guidance_embeds=True),
    )
    pipe.save_pretrained(outdir, safe_serialization=True)


# every attention projection of both block kinds (the joint blocks' image and text streams, the single blocks'
# fused QKV + MLP input and output)
LORA_TARGETS = (
    r"(single_)?transformer_blocks\.\d+\.attn\."
    r"(to_q|to_k|to_v|to_out(\.0)?|add_[qkv]_proj|to_add_out|to_qkv_mlp_proj)"
)


def build_lora(outdir: Path, *, seed: int = 0, rank: int = 4) -> None:
    """A LoRA for the [klein] and [dev] folders alike (their transformers differ only in the guidance embedding,
    which it does not touch): random non-zero A and B in PEFT keys (no alphas: scaling 1)."""
    from diffusers import Flux2Pipeline

    from omnistage.stages.diffusion.tiny_lora import random_lora, save

    save(Flux2Pipeline, Path(outdir), random_lora(transformer(text_dim=16), LORA_TARGETS, rank, seed))
