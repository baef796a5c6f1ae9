"""A Qwen2.5-VL text encoder and Qwen2-VL processor at toy size, with Qwen's vision special tokens (Qwen-Image's and LongCat-Image's text encoders)."""

from __future__ import annotations

from omnistage.models.shared.tiny.sizes import decoder, qwen_vision

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

    pad = tok.pad_token_id
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
    text = dict(decoder(len(tok), TEXT_DIM, max_positions=4096), rope_parameters=rope)
    text.update(pad_token_id=pad, bos_token_id=pad, eos_token_id=pad)
    vision = dict(qwen_vision(32, TEXT_DIM, patch=PATCH), window_size=112, fullatt_block_indexes=[0], in_channels=3)
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
