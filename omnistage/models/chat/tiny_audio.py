"""Tiny Qwen2-Audio (audio in, text out) with a locally trained tokenizer.

The real ``Qwen2AudioForConditionalGeneration`` architecture (Whisper-style
audio encoder, projector, Qwen2 LM) with random (seeded) float32 weights, head
size 32 (vLLM's CPU attention takes 32/64/128), and a working
``Qwen2AudioProcessor`` (a 32-bin Whisper feature extractor over 30 s windows at
16 kHz, the Qwen2-Audio chat layout). It loads in vLLM and in transformers; no
downloads:

    python -m omnistage.testing.tiny audio_lm DIR
"""

from __future__ import annotations

from pathlib import Path

from omnistage.models.chat.tiny import ROOT, save_multimodal, text_config, train_tokenizer

AUDIO_TOKENS = ["<|audio_bos|>", "<|AUDIO|>", "<|audio_eos|>"]
SAMPLE_RATE = 16000
CHUNK_S = 30  # the feature extractor pads each clip to 30 s (vLLM expects 3000 frames); the encoder follows
MEL_BINS = 32
HOP = 160

CHAT_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}"
    "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'audio' %}{% set audio_count.value = audio_count.value + 1 %}"
    "Audio {{ audio_count.value }}: <|audio_bos|><|AUDIO|><|audio_eos|>\n"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build(
    outdir: Path, *, seed: int = 0, head_dim: int = 32, num_layers: int = 2, max_position_embeddings: int = 2048
) -> None:
    from transformers import (
        Qwen2AudioConfig,
        Qwen2AudioForConditionalGeneration,
        Qwen2AudioProcessor,
        WhisperFeatureExtractor,
    )

    outdir = Path(outdir)
    tok = train_tokenizer(extra_special_tokens=AUDIO_TOKENS)
    bos = tok.convert_tokens_to_ids("<|endoftext|>")
    hidden = 2 * head_dim
    frames = CHUNK_S * SAMPLE_RATE // HOP
    config = Qwen2AudioConfig(
        audio_config=dict(
            num_mel_bins=MEL_BINS,
            encoder_layers=num_layers,
            encoder_attention_heads=2,
            encoder_ffn_dim=2 * hidden,
            d_model=hidden,
            max_source_positions=frames // 2,
            initializer_range=0.3,
        ),
        text_config=text_config(
            tok, hidden, num_layers, max_position_embeddings, model_type="qwen2", head_dim=head_dim
        ),
        audio_token_index=tok.convert_tokens_to_ids("<|AUDIO|>"),
        pad_token_id=bos,
        **ROOT,
        architectures=["Qwen2AudioForConditionalGeneration"],
    )
    save_multimodal(outdir, Qwen2AudioForConditionalGeneration, config, seed)
    _hub_layout(outdir / "model.safetensors")

    features = WhisperFeatureExtractor(
        feature_size=MEL_BINS, sampling_rate=SAMPLE_RATE, hop_length=HOP, chunk_length=CHUNK_S, n_fft=400
    )
    tok.chat_template = CHAT_TEMPLATE
    processor = Qwen2AudioProcessor(feature_extractor=features, tokenizer=tok, chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(outdir)
    tok.save_pretrained(outdir)


def _hub_layout(path: Path) -> None:
    """transformers 5.19 saves the LM as ``language_model.model.model.*``; the released
    Qwen2-Audio checkpoints (and vLLM's loader) use ``language_model.model.*``, which
    transformers also reads. Rewrite the keys to that layout."""
    from safetensors.torch import load_file, save_file

    doubled = "language_model.model.model."
    weights = load_file(path)
    save_file(
        {
            (k.replace(doubled, "language_model.model.", 1) if k.startswith(doubled) else k): v
            for k, v in weights.items()
        },
        path,
        metadata={"format": "pt"},
    )
