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

from omnistage.models.shared.tiny import causal_lm, mimi

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
    from transformers import Qwen2ForCausalLM, Qwen2Tokenizer

    tok = Qwen2Tokenizer().train_new_from_iterator(_CORPUS * 20, vocab_size=300, new_special_tokens=SPECIAL)
    offset = len(tok)
    tok.add_tokens([f"<|c_{i}|>" for i in range(CODEBOOK_SIZE)], special_tokens=True)
    assert tok.convert_tokens_to_ids("<|c_0|>") == offset
    end = tok.convert_tokens_to_ids("<|speech_end|>")
    bos = tok.convert_tokens_to_ids("<|endoftext|>")
    _save_lm(outdir, Qwen2ForCausalLM, tok, seed=seed, head_dim=head_dim, bos=bos, end=end)
    return offset


def _save_lm(outdir: Path, model_class, tok, *, seed: int, head_dim: int, bos: int, end: int) -> None:
    """A speech LM that stops on ``end``, silent at first (see ``causal_lm.save``)."""
    config = causal_lm.config(
        model_class, tok, head_dim=head_dim, max_positions=2048, bos=bos, eos=end, pad=tok.pad_token_id
    )
    causal_lm.save(outdir, model_class, config, tok, seed=seed, eos=end, silent_end=True)


def build_codec(outdir: Path, *, seed: int = 0) -> None:
    import torch
    from transformers import MimiModel

    config = mimi.config(16000, [8, 5, 4], CODEBOOK_SIZE, NUM_QUANTIZERS)
    torch.manual_seed(seed)
    model = MimiModel(config).eval()
    mimi.spread_codebooks(model)
    model.save_pretrained(outdir)


def build(outdir: Path) -> None:
    outdir = Path(outdir)
    offset = build_lm(outdir / "lm")
    build_codec(outdir / "codec")
    meta = {
        "pipeline": "codec_tts",
        "prompt_template": "<|text_start|>{voice}{text}<|text_end|><|speech_start|>",
        "voices": VOICES,
        "default_voice": "alto",
        "speech_end_token": "<|speech_end|>",
        "codec_token_offset": offset,
        "codebook_size": CODEBOOK_SIZE,
        "num_quantizers": NUM_QUANTIZERS,
        "layout": "shared",
        "chunk_frames": 4,
    }
    (outdir / "omnistage.json").write_text(json.dumps(meta, indent=2) + "\n")


# ----------------------------------------------------------------------------- llasa
# A Llasa-style folder: a Llama speech LM (Llama-3 chat format, Llasa's special tokens, one token
# per XCodec2 frame) and a tiny XCodec2 codec (one FSQ codebook of 4*4*4 = 64 codes, 50 frames/s at
# 16 kHz). Its prompt_template is the text of Llasa's chat prompt, so voice cloning works the Llasa way.

LLASA_SPECIAL = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|TEXT_UNDERSTANDING_START|>",
    "<|TEXT_UNDERSTANDING_END|>",
    "<|SPEECH_GENERATION_START|>",
    "<|SPEECH_GENERATION_END|>",
]
LLASA_LEVELS = [4, 4, 4]
LLASA_CODES = 64
# Llama 3's chat template, reduced to what Llasa uses (no system prompt)
LLASA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
LLASA_TEMPLATE = (
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nConvert the text to speech:"
    "<|TEXT_UNDERSTANDING_START|>{text}<|TEXT_UNDERSTANDING_END|><|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n<|SPEECH_GENERATION_START|>{ref_codes}"
)
_LLASA_CORPUS = _CORPUS + ["user assistant Convert the text to speech:", "a reference clip, spoken by someone."]


def build_llasa_lm(outdir: Path, *, seed: int = 0, head_dim: int = 32) -> int:
    """Writes the Llama LM folder; returns the id of ``<|s_0|>``."""
    from transformers import LlamaForCausalLM, Qwen2Tokenizer

    tok = Qwen2Tokenizer().train_new_from_iterator(_LLASA_CORPUS * 20, vocab_size=300, new_special_tokens=LLASA_SPECIAL)
    offset = len(tok)
    tok.add_tokens([f"<|s_{i}|>" for i in range(LLASA_CODES)], special_tokens=True)
    assert tok.convert_tokens_to_ids("<|s_0|>") == offset
    tok.bos_token, tok.eos_token = "<|begin_of_text|>", "<|end_of_text|>"
    tok.chat_template = LLASA_CHAT_TEMPLATE
    end = tok.convert_tokens_to_ids("<|SPEECH_GENERATION_END|>")
    _save_lm(outdir, LlamaForCausalLM, tok, seed=seed, head_dim=head_dim, bos=tok.bos_token_id, end=end)
    return offset


def build_xcodec2(outdir: Path, *, seed: int = 0) -> None:
    import torch
    from transformers import Xcodec2Config, Xcodec2Model

    semantic = {
        "model_type": "wav2vec2-bert",
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "feature_projection_input_dim": 160,
        "conv_depthwise_kernel_size": 5,
        "left_max_position_embeddings": 8,
        "right_max_position_embeddings": 2,
    }
    # hidden_size 64: the decoder's GroupNorm has 32 groups; hop 2*2*4*4*5 = 320 samples (50 frames/s)
    config = Xcodec2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        encoder_hidden_size=2,
        semantic_model_config=semantic,
        quantization_dim=64 + 32,
        quantization_levels=LLASA_LEVELS,
        max_position_embeddings=64,
        sampling_rate=16000,
        initializer_range=0.1,  # at 0.02 the encoder's output is ~0 (every clip one code) and the audio ~0.02 peak
    )
    torch.manual_seed(seed)
    Xcodec2Model(config).eval().save_pretrained(outdir)


def build_llasa(outdir: Path) -> None:
    outdir = Path(outdir)
    offset = build_llasa_lm(outdir / "lm")
    build_xcodec2(outdir / "codec")
    meta = {
        "pipeline": "codec_tts",
        "prompt_template": LLASA_TEMPLATE,
        "speech_end_token": "<|SPEECH_GENERATION_END|>",
        "codec_token_offset": offset,
        "codebook_size": LLASA_CODES,
        "num_quantizers": 1,
        "layout": "shared",
        "chunk_frames": 8,
        "initial_chunk_frames": 4,
    }
    (outdir / "omnistage.json").write_text(json.dumps(meta, indent=2) + "\n")
