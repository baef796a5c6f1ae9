"""Tiny HunyuanVideo-1.5 folders: real classes (HunyuanVideo15Transformer3DModel, a Qwen2.5-VL text model, a ByT5
glyph encoder, AutoencoderKLHunyuanVideo15, diffusers' CFG guider), random weights, a locally trained byte-level
Qwen2 tokenizer with Qwen's chat template. Sizes: multiples of 16 (VAE x4, patch 1... the transformer's RoPE
wants multiples of 4 latent pixels), frame counts 2k+1 (the release: x16 and 4k+1)."""

from __future__ import annotations

from pathlib import Path

from omnistage.stages.diffusion import tiny_parts as parts

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tokenizer():
    from transformers import Qwen2Tokenizer

    # trained on prompts only: the long system message then takes more than the 108 tokens the pipeline crops,
    # so every prompt token reaches the DiT (as with Qwen's own tokenizer, whose template is exactly 108 tokens)
    tok = Qwen2Tokenizer().train_new_from_iterator(
        parts._CORPUS * 4, vocab_size=300, new_special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    )
    tok.pad_token = "<|endoftext|>"
    tok.chat_template = CHAT_TEMPLATE
    return tok


def components(task: str = "t2v"):
    import torch
    from diffusers import AutoencoderKLHunyuanVideo15, FlowMatchEulerDiscreteScheduler, HunyuanVideo15Transformer3DModel
    from diffusers.guiders import ClassifierFreeGuidance
    from transformers import ByT5Tokenizer, Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel

    tok = tokenizer()
    torch.manual_seed(0)
    text_encoder = Qwen2_5_VLTextModel(
        Qwen2_5_VLTextConfig(
            vocab_size=len(tok),
            hidden_size=16,
            intermediate_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            pad_token_id=tok.pad_token_id,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [1, 1, 2]},
        )
    ).eval()
    text_encoder_2 = parts.t5_encoder(d_model=32, vocab_size=384)  # ByT5's 256 bytes + specials + extra ids
    torch.manual_seed(0)
    transformer = HunyuanVideo15Transformer3DModel(
        in_channels=9,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=8,
        num_layers=2,
        num_refiner_layers=1,
        mlp_ratio=2.0,
        patch_size=1,
        patch_size_t=1,
        text_embed_dim=16,
        text_embed_2_dim=32,
        image_embed_dim=12,
        rope_axes_dim=(2, 2, 4),
        target_size=16,
        task_type=task,
    ).eval()
    torch.manual_seed(0)
    vae = AutoencoderKLHunyuanVideo15(
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        block_out_channels=(16, 16),
        layers_per_block=1,
        spatial_compression_ratio=4,
        temporal_compression_ratio=2,
        downsample_match_channel=False,
        upsample_match_channel=False,
    ).eval()
    return dict(
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        text_encoder=text_encoder,
        tokenizer=tok,
        text_encoder_2=text_encoder_2,
        tokenizer_2=ByT5Tokenizer(),
        guider=ClassifierFreeGuidance(guidance_scale=6.0),
    )


def build(outdir: Path) -> None:
    """Write a loadable HunyuanVideo15Pipeline folder (text -> video)."""
    from diffusers import HunyuanVideo15Pipeline

    HunyuanVideo15Pipeline(**components()).save_pretrained(outdir, safe_serialization=True)


def build_i2v(outdir: Path) -> None:
    """Write a loadable HunyuanVideo15ImageToVideoPipeline folder (SigLIP image tokens + first-frame latents)."""
    import torch
    from diffusers import HunyuanVideo15ImageToVideoPipeline
    from transformers import SiglipImageProcessor, SiglipVisionConfig, SiglipVisionModel

    parts_ = components(task="i2v")
    torch.manual_seed(0)
    # hidden size = the DiT's image_embed_dim; 32 px / 8 px patches = 16 image tokens
    encoder = SiglipVisionModel(
        SiglipVisionConfig(
            hidden_size=12,
            intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
        )
    ).eval()
    extractor = SiglipImageProcessor(size={"height": 32, "width": 32})
    HunyuanVideo15ImageToVideoPipeline(**parts_, image_encoder=encoder, feature_extractor=extractor).save_pretrained(
        outdir, safe_serialization=True
    )
