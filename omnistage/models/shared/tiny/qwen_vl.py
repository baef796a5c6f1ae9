"""A Qwen2.5-VL text encoder and Qwen2-VL processor at toy size, with Qwen's vision special tokens (Qwen-Image's and LongCat-Image's text encoders)."""

from __future__ import annotations

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]


TEXT_DIM = 32  # text encoder hidden size = the transformer's joint_attention_dim


MERGE = 2  # Qwen2-VL merges 2x2 vision patches into one token


PATCH = 14


def text_encoder(tok, seed: int = 0):
    """Qwen2.5-VL at toy size; its vision tower's output width is the text width (as in the real model)."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    text = dict(
        vocab_size=len(tok),
        hidden_size=TEXT_DIM,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.pad_token_id,
        eos_token_id=tok.pad_token_id,
    )
    vision = dict(
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=TEXT_DIM,
        patch_size=PATCH,
        spatial_merge_size=MERGE,
        temporal_patch_size=2,
        window_size=112,
        fullatt_block_indexes=[0],
        in_channels=3,
    )
    ids = {
        name: tok.convert_tokens_to_ids(t)
        for name, t in (
            ("image_token_id", "<|image_pad|>"),
            ("video_token_id", "<|video_pad|>"),
            ("vision_start_token_id", "<|vision_start|>"),
            ("vision_end_token_id", "<|vision_end|>"),
        )
    }
    config = Qwen2_5_VLConfig(
        text_config=text, vision_config=vision, **ids, architectures=["Qwen2_5_VLForConditionalGeneration"]
    )
    torch.manual_seed(seed)
    return Qwen2_5_VLForConditionalGeneration(config).to(torch.float32).eval()


def processor(tok):
    """transformers' Qwen2VLProcessor, the class the released edit checkpoints' ``processor/`` folder names (image
    and video halves, the tokenizer), saved by diffusers with the pipeline: the released normalisation, with at
    most 16 merged vision tokens per image (the real cap is 16384)."""
    from transformers import Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor

    sizes = dict(
        min_pixels=4 * (PATCH * MERGE) ** 2,
        max_pixels=16 * (PATCH * MERGE) ** 2,
        patch_size=PATCH,
        merge_size=MERGE,
        temporal_patch_size=2,
    )
    return Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(**sizes), tokenizer=tok, video_processor=Qwen2VLVideoProcessor(**sizes)
    )
