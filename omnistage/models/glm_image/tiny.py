"""Tiny GLM-Image folder: the real diffusers GlmImagePipeline layout, random weights.

    python -m omnistage.testing.tiny glm_image DIR

Components are the real classes (transformers GlmImageForConditionalGeneration
and GlmImageProcessor, diffusers GlmImageTransformer2DModel, AutoencoderKL,
ByT5 + T5 glyph encoder) at toy sizes. The AR tokenizer is trained locally and
keeps GLM-Image's special-token layout: the vision vocabulary comes first
(``<|dit_token_N|>``: codebook ids, then image start = bos and image end = eos),
text tokens after it, plus ``<|image|>``, ``<sop>``/``<eop>`` grid markers.

Sizes: the processor fixes the AR grid at 32 px per token and the pipeline
upsamples prior tokens x2, so the VAE is x8 with patch 2 (as the real model);
heights and widths are multiples of 32.
"""

from __future__ import annotations

import string
from pathlib import Path

CODEBOOK = 64  # VQ codebook size: image token ids 0..63
IMAGE_START = CODEBOOK  # <|dit_token_64|>: image start, the AR's bos
IMAGE_END = CODEBOOK + 1  # <|dit_token_65|>: image end, the AR's eos
VISION_VOCAB = 80  # lm_head width (ids 66..79 unused, as in the real model's padding)
HEAD_DIM = 64  # supported by vLLM's CPU attention
MROPE_SECTION = [4, 6, 6]  # rotary dims (T, H, W) / 2: half of HEAD_DIM rotates, like GLM-Image

CHAT_TEMPLATE = (
    "{% for m in messages %}<|user|>\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}<|dit_token_64|><|image|><|dit_token_65|>{% else %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{% endfor %}<|assistant|>\n"
)
_CORPUS = [
    "a photo of a red cat sitting on a blue chair",
    "a watercolor painting of mountains at sunset",
    "a sign that says 'hello world' in neon letters",
    "green square and yellow circle on a white background",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 16 24 32 48 64",
    string.ascii_letters + string.digits + string.punctuation + " \n",
]


def ar_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    dit = [f"<|dit_token_{i}|>" for i in range(VISION_VOCAB)]
    specials = dit + ["<|endoftext|>", "<|image|>", "<sop>", "<eop>", "<|user|>", "<|assistant|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    # special tokens take the first ids, in order: the vision vocabulary is ids 0..VISION_VOCAB-1
    bpe.train_from_iterator(
        _CORPUS * 20,
        trainers.BpeTrainer(
            vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    # A plain fast tokenizer carrying the special-token attributes GlmImageProcessor reads.
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|dit_token_64|>",
        eos_token="<|dit_token_65|>",
        pad_token="<|endoftext|>",
        extra_special_tokens={"image_token": "<|image|>", "grid_bos_token": "<sop>", "grid_eos_token": "<eop>"},
    )
    for i, t in enumerate(dit):  # the vision vocabulary must be ids 0..VISION_VOCAB-1
        assert tok.convert_tokens_to_ids(t) == i, (t, tok.convert_tokens_to_ids(t))
    return tok


def image_processor():
    """Source images for image-to-image: the processor halves them and cuts 16 px patches, so the vision
    encoder (patch 16, no merge) yields one VQ token per 32x32 source pixels, the AR grid."""
    from transformers import GlmImageImageProcessor

    return GlmImageImageProcessor(
        patch_size=16, merge_size=1, temporal_patch_size=1, size={"shortest_edge": 32 * 32, "longest_edge": 2048 * 2048}
    )


def ar_model(tok, seed: int = 0):
    import torch
    from transformers import GlmImageConfig, GlmImageForConditionalGeneration

    text = dict(
        vocab_size=len(tok),
        hidden_size=2 * HEAD_DIM,
        intermediate_size=4 * HEAD_DIM,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": MROPE_SECTION,
        },
        pad_token_id=tok.pad_token_id,
        vision_vocab_size=VISION_VOCAB,
        eos_token_id=IMAGE_END,
        initializer_range=0.3,
    )
    vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, patch_size=16, image_size=512)
    vq = dict(embed_dim=16, num_embeddings=CODEBOOK, latent_channels=32)
    config = GlmImageConfig(
        text_config=text,
        vision_config=vision,
        vq_config=vq,
        image_token_id=tok.convert_tokens_to_ids("<|image|>"),
        image_start_token_id=IMAGE_START,
        image_end_token_id=IMAGE_END,
        architectures=["GlmImageForConditionalGeneration"],
    )
    torch.manual_seed(seed)
    model = GlmImageForConditionalGeneration(config).to(torch.float32).eval()
    with torch.no_grad():
        # Random weights must still produce a full image: only codebook ids are ever the
        # argmax (a sampled non-code id would be an invalid prior token or an early stop).
        model.lm_head.weight[CODEBOOK:] = 0.0
        model.lm_head.weight[:CODEBOOK] *= 4.0
    return model


def build(outdir: Path, *, seed: int = 0) -> None:
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, GlmImagePipeline, GlmImageTransformer2DModel
    from transformers import ByT5Tokenizer, GenerationConfig, GlmImageProcessor

    from omnistage.models.shared.tiny import autoencoder_kl
    from omnistage.stages.diffusion.tiny_parts import t5_encoder

    outdir = Path(outdir)
    tok = ar_tokenizer()
    processor = GlmImageProcessor(image_processor=image_processor(), tokenizer=tok, chat_template=CHAT_TEMPLATE)
    ar = ar_model(tok, seed)
    ar.generation_config = GenerationConfig(
        bos_token_id=IMAGE_START, eos_token_id=IMAGE_END, pad_token_id=tok.pad_token_id
    )
    torch.manual_seed(seed)
    transformer = GlmImageTransformer2DModel(
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=1,
        attention_head_dim=8,
        num_attention_heads=4,
        text_embed_dim=32,
        time_embed_dim=32,
        condition_dim=16,
        prior_vq_quantizer_codebook_size=VISION_VOCAB,
    )
    vae = autoencoder_kl.vae(  # x8, as GLM-Image's VAE
        sample_size=64,
        use_quant_conv=False,
        use_post_quant_conv=False,
        latents_mean=[0.1, -0.2, 0.05, 0.0],
        latents_std=[1.5, 0.9, 1.1, 1.0],
    )
    scheduler = FlowMatchEulerDiscreteScheduler(
        base_image_seq_len=256, base_shift=0.25, max_shift=0.75, time_shift_type="linear", use_dynamic_shifting=True
    )
    pipe = GlmImagePipeline(
        tokenizer=ByT5Tokenizer(),
        processor=processor,
        text_encoder=t5_encoder(vocab_size=384),
        vision_language_encoder=ar,
        vae=vae.eval(),
        transformer=transformer.eval(),
        scheduler=scheduler,
    )
    pipe.save_pretrained(outdir, safe_serialization=True)
