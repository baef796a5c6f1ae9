"""Tiny codec_tts folder: a Qwen2 speech LM whose vocabulary holds Mimi codec
tokens, a tiny Mimi codec (random codebooks), and ``omnistage.json``.

    python -m omnistage.testing.tiny codec_tts DIR

Random (seeded) weights, a locally trained tokenizer, no downloads. The LM's
head size is 32 (vLLM's CPU attention supports 32/64/128). The codec has
K=2 codebooks of 32 codes at 50 frames/s, 16 kHz (320 samples per frame), and
a short attention window so the streamed decode's context is small.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

SPECIAL = ["<|endoftext|>", "<|text_start|>", "<|text_end|>", "<|speech_start|>", "<|speech_end|>"]
CODEBOOK_SIZE = 32
NUM_QUANTIZERS = 2
VOICES = {"alto": "alto: ", "bass": "bass: "}
_CORPUS = [
    "hello world, this is a tiny text to speech model speaking.",
    "alto: the quick brown fox jumps over the lazy dog",
    "bass: good morning, how are you today? i am fine, thank you.",
    string.ascii_letters + string.digits + string.punctuation + " \n",
]


def build_lm(outdir: Path, *, seed: int = 0, head_dim: int = 32) -> int:
    """Writes the LM folder; returns the id of codec token 0."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

    tok = Qwen2Tokenizer().train_new_from_iterator(_CORPUS * 20, vocab_size=300, new_special_tokens=SPECIAL)
    offset = len(tok)
    tok.add_tokens([f"<|c_{i}|>" for i in range(CODEBOOK_SIZE)], special_tokens=True)
    assert tok.convert_tokens_to_ids("<|c_0|>") == offset
    end = tok.convert_tokens_to_ids("<|speech_end|>")
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=2 * head_dim, intermediate_size=4 * head_dim, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=head_dim, max_position_embeddings=2048,
        tie_word_embeddings=True, initializer_range=0.3,  # peaked logits: greedy choices are not near-ties
        bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"), eos_token_id=end, pad_token_id=tok.pad_token_id,
        torch_dtype="float32", architectures=["Qwen2ForCausalLM"],
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():  # a zero (tied) embedding: the end token's logit is 0, so random weights rarely stop at once
        model.get_input_embeddings().weight[end] = 0
    model.save_pretrained(outdir)
    GenerationConfig(eos_token_id=end, bos_token_id=config.bos_token_id, pad_token_id=config.pad_token_id).save_pretrained(outdir)
    tok.save_pretrained(outdir)
    return offset


def build_codec(outdir: Path, *, seed: int = 0) -> None:
    import torch
    from transformers import MimiConfig, MimiModel

    config = MimiConfig(
        sampling_rate=16000, hidden_size=32, num_filters=4, upsampling_ratios=[8, 5, 4],
        codebook_size=CODEBOOK_SIZE, codebook_dim=16, num_quantizers=NUM_QUANTIZERS, num_semantic_quantizers=1,
        vector_quantization_hidden_dimension=16, upsample_groups=32, num_hidden_layers=2, intermediate_size=64,
        num_attention_heads=2, num_key_value_heads=2, head_dim=16, sliding_window=8, max_position_embeddings=8192,
        layer_scale_initial_scale=1.0,  # the transformer matters, so the streamed context is really exercised
    )
    torch.manual_seed(seed)
    model = MimiModel(config).eval()
    for module in model.modules():
        if type(module).__name__ == "MimiEuclideanCodebook":  # initialised to zeros: every code would sound the same
            module.embed_sum.normal_(std=0.03)
            module._embed = None
    model.save_pretrained(outdir)


def build(outdir: Path) -> None:
    outdir = Path(outdir)
    offset = build_lm(outdir / "lm")
    build_codec(outdir / "codec")
    meta = {
        "pipeline": "codec_tts",
        "prompt_template": "<|text_start|>{voice}{text}<|text_end|><|speech_start|>",
        "voices": VOICES, "default_voice": "alto", "speech_end_token": "<|speech_end|>",
        "codec_token_offset": offset, "codebook_size": CODEBOOK_SIZE, "num_quantizers": NUM_QUANTIZERS,
        "layout": "shared", "chunk_frames": 4,
    }
    (outdir / "omnistage.json").write_text(json.dumps(meta, indent=2) + "\n")
