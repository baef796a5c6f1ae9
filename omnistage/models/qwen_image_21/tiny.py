"""Tiny Qwen-Image-2.1 folder: real classes (QwenImage21Transformer2DModel, Qwen3-VL with its processor,
AutoencoderKLQwenImage21), random weights."""

from __future__ import annotations

from pathlib import Path

from omnistage.models.shared.tiny.qwen_vl import SPECIAL_TOKENS
from omnistage.models.shared.tiny.sizes import decoder, qwen_vision

# Qwen3-VL's template for the turns the pipeline renders (content a string or a list of text parts)
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}"
    "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def processor(vocab_size: int = 300):
    from transformers import Qwen2Tokenizer, Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    from omnistage.stages.diffusion.tiny_parts import _CORPUS

    tok = Qwen2Tokenizer().train_new_from_iterator(
        _CORPUS * 4, vocab_size=vocab_size, new_special_tokens=SPECIAL_TOKENS
    )
    tok.pad_token = "<|endoftext|>"
    tok.chat_template = CHAT_TEMPLATE
    return Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(patch_size=16, merge_size=2, temporal_patch_size=2),
        tokenizer=tok,
        video_processor=Qwen3VLVideoProcessor(),
        chat_template=CHAT_TEMPLATE,
    )


def text_encoder(tok, hidden: int = 32):
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    ids = {
        name: tok.convert_tokens_to_ids(f"<|{token}|>")
        for name, token in (
            ("image_token_id", "image_pad"),
            ("video_token_id", "video_pad"),
            ("vision_start_token_id", "vision_start"),
            ("vision_end_token_id", "vision_end"),
        )
    }
    text = dict(
        decoder(len(tok), hidden, head_dim=16), rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3]}
    )
    vision = dict(qwen_vision(16, hidden), num_position_embeddings=64, deepstack_visual_indexes=[0])
    return Qwen3VLForConditionalGeneration(Qwen3VLConfig(text_config=text, vision_config=vision, **ids)).eval()


def transformer(*, text_dim: int = 32, latent_channels: int = 16):
    from diffusers import QwenImage21Transformer2DModel

    # RoPE over (frame, row, column) splitting the head dim as the real (16, 56, 56) does, roughly
    return QwenImage21Transformer2DModel(
        patch_size=1,
        in_channels=latent_channels,
        out_channels=latent_channels,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        context_in_dim=text_dim,
        axes_dims_rope=(4, 6, 6),
    ).eval()


def vae(latent_channels: int = 16):
    import torch
    from diffusers import AutoencoderKLQwenImage21

    # non-trivial per-channel statistics, so (de)normalisation is exercised; RGB out (the tests compare RGB)
    g = torch.Generator().manual_seed(1)
    mean = (torch.randn(latent_channels, generator=g) * 0.3).tolist()
    std = (torch.rand(latent_channels, generator=g) + 0.8).tolist()
    return AutoencoderKLQwenImage21(
        base_dim=8,
        decoder_base_dim=8,
        z_dim=latent_channels,
        dim_mult=[1, 1, 1, 1, 1],
        num_res_blocks=1,
        latents_mean=mean,
        latents_std=std,
        in_channels=4,
        out_channels=3,
    ).eval()


def build(outdir: Path) -> None:
    """A QwenImage21Pipeline folder (dynamic shift, no sample_sigmas: linspace); sizes are multiples of 32."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImage21Pipeline

    torch.manual_seed(0)
    proc = processor()
    encoder = text_encoder(proc.tokenizer)
    pipe = QwenImage21Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True),
        vae=vae(),
        text_encoder=encoder,
        processor=proc,
        transformer=transformer(text_dim=encoder.config.text_config.hidden_size),
    )
    pipe.save_pretrained(outdir, safe_serialization=True)


# the attention projections and the image MLP of every block
LORA_TARGETS = r"transformer_blocks\.\d+\.(attn\.(to_q|to_k|to_v|to_out\.0)|img_mlp\.(proj|out|gate_layer))"


def build_lora(outdir: Path, *, seed: int = 0, rank: int = 4) -> None:
    """A LoRA for the model ``build`` writes: random non-zero A and B in PEFT keys (no alphas: scaling 1)."""
    from diffusers import QwenImage21Pipeline

    from omnistage.stages.diffusion.tiny_lora import random_lora, save

    save(QwenImage21Pipeline, Path(outdir), random_lora(transformer(), LORA_TARGETS, rank, seed))
