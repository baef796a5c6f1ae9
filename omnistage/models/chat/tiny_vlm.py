"""Tiny Idefics3 vision-language model (images in, text out) with a locally trained tokenizer.

The real ``Idefics3ForConditionalGeneration`` architecture (SigLIP-style vision
tower, pixel-shuffle connector, Llama LM) with random (seeded) float32 weights,
head size 32 everywhere (vLLM's CPU attention takes 32/64/128), and a working
``Idefics3Processor``: 32 px tiles, images up to 64 px split into at most 2x2
tiles plus a global view, 4 tokens per tile, and a ChatML chat template with
image parts (``add_vision_id`` numbers them). It loads in vLLM and in
transformers; no downloads:

    python -m omnistage.testing.tiny vlm DIR

Beside Qwen2.5-VL / Qwen3-VL (tiny_qwen_vl.py: images and video as one run of
merged-patch tokens each) this one covers another image layout: tiles plus a
global view with row/column markers, and a processor option
(``do_image_splitting``) that changes the prompt.
"""

from __future__ import annotations

from pathlib import Path

from omnistage.models.chat.tiny import ROOT, save_multimodal, text_config, train_tokenizer

TILE, PATCH, SCALE = 32, 8, 2  # tile side (px), vision patch (px), pixel-shuffle factor
TOKENS_PER_TILE = (TILE // PATCH) ** 2 // SCALE**2
MAX_TILES_PER_SIDE = 2
IMAGE_TOKENS = ["<fake_token_around_image>", "<image>", "<global-img>"] + [
    f"<row_{r}_col_{c}>" for r in range(1, MAX_TILES_PER_SIDE + 1) for c in range(1, MAX_TILES_PER_SIDE + 1)
]

CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<image>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build(
    outdir: Path, *, seed: int = 0, head_dim: int = 32, num_layers: int = 2, max_position_embeddings: int = 2048
) -> None:
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3Processor,
    )

    outdir = Path(outdir)
    tok = train_tokenizer(extra_special_tokens=IMAGE_TOKENS)
    bos = tok.convert_tokens_to_ids("<|endoftext|>")
    hidden = 2 * head_dim
    config = Idefics3Config(
        vision_config=dict(
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=num_layers,
            num_attention_heads=2,
            image_size=TILE,
            patch_size=PATCH,
            initializer_range=0.3,
        ),
        text_config=text_config(
            tok, hidden, num_layers, max_position_embeddings, model_type="llama", head_dim=head_dim, rms_norm_eps=1e-5
        ),
        scale_factor=SCALE,
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        pad_token_id=bos,
        **ROOT,
        architectures=["Idefics3ForConditionalGeneration"],
    )
    save_multimodal(outdir, Idefics3ForConditionalGeneration, config, seed)

    images = Idefics3ImageProcessorPil(
        size={"longest_edge": MAX_TILES_PER_SIDE * TILE}, max_image_size={"longest_edge": TILE}, do_image_splitting=True
    )
    tok.chat_template = CHAT_TEMPLATE
    processor = Idefics3Processor(
        image_processor=images, tokenizer=tok, image_seq_len=TOKENS_PER_TILE, chat_template=CHAT_TEMPLATE
    )
    processor.save_pretrained(outdir)
    tok.save_pretrained(outdir)
