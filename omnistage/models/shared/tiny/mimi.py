"""Kyutai's Mimi codec at toy size (the codec TTS family's and CSM's audio tokenizer)."""

from __future__ import annotations

# what the fixtures' codecs share: a narrow convolutional stack, one semantic quantizer, and a two-layer transformer
# with an 8-frame window at full-strength layer scale (it matters, so a streamed context is really exercised)
CONVOLUTIONS = {"hidden_size": 32, "num_filters": 4, "upsample_groups": 32}
QUANTIZERS = {"codebook_dim": 16, "num_semantic_quantizers": 1, "vector_quantization_hidden_dimension": 16}
TRANSFORMER = {"num_hidden_layers": 2, "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 2}
WINDOW = {"head_dim": 16, "sliding_window": 8, "max_position_embeddings": 8192, "layer_scale_initial_scale": 1.0}


def config(rate: int, ratios: list[int], codes: int, quantizers: int, **extra):
    """A ``MimiConfig`` at ``rate`` Hz upsampling by ``ratios``, ``quantizers`` codebooks of ``codes`` entries;
    ``extra``: e.g. CSM's ``frame_rate``."""
    from transformers import MimiConfig

    fields = dict(sampling_rate=rate, upsampling_ratios=ratios, codebook_size=codes, num_quantizers=quantizers)
    return MimiConfig(**fields, **CONVOLUTIONS, **QUANTIZERS, **TRANSFORMER, **WINDOW, **extra)


def spread_codebooks(model) -> None:
    """Draw the codebooks' sums, which start at zero (every code would sound the same)."""
    for name, buf in model.named_buffers():
        if name.endswith("codebook.embed_sum"):
            buf.normal_(std=0.03)
