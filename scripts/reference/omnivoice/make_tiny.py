"""Tiny OmniVoice checkpoint, written by the reference's own classes (``omnivoice.OmniVoice`` with a
Qwen3 backbone, transformers' ``HiggsAudioV2TokenizerModel`` in ``audio_tokenizer/``), run in the
reference venv that ``setup.sh`` builds.

    HF_HUB_OFFLINE=1 /work/refvenv/omnivoice/bin/python make_tiny.py OUT_DIR

The release's structure where it matters: 8 codebooks of 1024 codes plus the mask id (1024), 24 kHz audio
at 25 frames/s (a DAC decoder upsampling 8*5*4*2*3 = 960), the release's style/text special tokens.
Smaller where it costs nothing structural: a 2-layer Qwen3 of width 32, thin DAC/HuBERT parts, a byte-level
BPE tokenizer trained here. Every parameter is drawn from the seed, so a rerun writes the same weights.
"""

import string
import sys
from pathlib import Path

import torch
from omnivoice import OmniVoice, OmniVoiceConfig
from transformers import DacFeatureExtractor, HiggsAudioV2TokenizerConfig, HiggsAudioV2TokenizerModel, Qwen2Tokenizer

SAMPLE_RATE = 24000
SPECIAL = [
    "<|denoise|>",
    "<|lang_start|>",
    "<|lang_end|>",
    "<|instruct_start|>",
    "<|instruct_end|>",
    "<|text_start|>",
    "<|text_end|>",
    "<|endoftext|>",
]
CORPUS = [
    "hello there, how are you today? a clip of my voice.",
    "the sun rises in the east and sets in the west.",
    "male, female, child, elderly, low pitch, high pitch, whisper, british accent, en, zh, None",
    string.ascii_letters + string.digits + string.punctuation + " \n",
]


def tokenizer():
    tok = Qwen2Tokenizer().train_new_from_iterator(CORPUS * 20, vocab_size=300, new_special_tokens=SPECIAL)
    tok.eos_token = tok.pad_token = "<|endoftext|>"
    return tok


def seeded(module: torch.nn.Module, seed: int) -> None:
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            if "audio_embeddings" in name or "audio_heads" in name or "embed_tokens" in name:
                p.normal_(0.0, 0.5)  # spread logits so greedy picks are not near-ties
            else:
                p.normal_(0.0, 0.5 if p.dim() == 1 else 0.2)
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.add_(1.0)


def build(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok = tokenizer()
    tok.save_pretrained(out)
    llm = {
        "model_type": "qwen3",
        # the text embedding is looked up at every position, audio ones too (ids up to the mask id 1024,
        # the result discarded there): the release's 151k vocabulary covers them, a tiny one must too
        "vocab_size": max(len(tok), 1025),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    }
    config = OmniVoiceConfig(llm_config=llm, architectures=["OmniVoice"])
    config.llm_config._attn_implementation = "sdpa"
    model = OmniVoice(config).eval()
    seeded(model, 0)
    model.save_pretrained(out, safe_serialization=True)

    at = out / "audio_tokenizer"
    at_cfg = HiggsAudioV2TokenizerConfig(
        target_bandwidths=[0.5, 1.0, 2.0],  # 2 kbps at 25 Hz and 10 bits a code: 8 codebooks, as the release
        sample_rate=SAMPLE_RATE,
        codebook_size=1024,
        codebook_dim=8,
        acoustic_model_config={
            "encoder_hidden_size": 4,
            "downsampling_ratios": [8, 5, 4, 2, 3],
            "upsampling_ratios": [8, 5, 4, 2, 3],
            "decoder_hidden_size": 32,
            "hidden_size": 16,
            "sampling_rate": SAMPLE_RATE,
        },
        semantic_model_config={
            "hidden_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 32,
            "conv_dim": [8] * 7,
            "num_conv_pos_embeddings": 16,
            "num_conv_pos_embedding_groups": 4,
        },
    )
    audio_tokenizer = HiggsAudioV2TokenizerModel(at_cfg).eval()
    seeded(audio_tokenizer, 1)
    audio_tokenizer.save_pretrained(at, safe_serialization=True)
    DacFeatureExtractor(feature_size=1, hop_length=1, sampling_rate=SAMPLE_RATE).save_pretrained(at)


if __name__ == "__main__":
    build(Path(sys.argv[1]))
