"""Tiny Voxtral in both of its layouts, the same (random, seeded) weights in each.

transformers' ``VoxtralForConditionalGeneration`` (a Whisper-style encoder over 30 s windows, the 4-frame
projector, a Llama-style LM) is built with float32 weights drawn here, head size 32 (vLLM's CPU attention takes
32/64/128), and saved in transformers' layout (``config.json`` + ``model.safetensors`` + the Whisper feature
extractor's ``preprocessor_config.json``) — the ``generate`` reference. The same tensors are written in Mistral's
own layout (``params.json`` with ``multimodal.whisper_model_args``, ``consolidated.safetensors``), the only one
vLLM 0.32's ``VoxtralForConditionalGeneration`` reads, renamed by ``MISTRAL_NAMES`` (our own table; the LM's
q/k rows go back to Mistral's interleaved rotary order, which vLLM's loader undoes). One tokenizer serves both:
a byte-level ``tekken.json`` (no merges: 256 byte tokens after 100 special ones, ``[AUDIO]`` at 24 where
transformers' ``VoxtralProcessor`` expects it, ``[BEGIN_AUDIO]``, ``[TRANSCRIBE]``) with the audio section
mistral_common's transcription request reads (16 kHz, 12.5 audio tokens a second, 30 s chunks). A folder holding
both layouts is what the released checkpoints ship. No downloads:

    python -m omnistage.testing.tiny voxtral DIR
"""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

from omnistage.models.shared.tiny.sizes import decoder

SAMPLE_RATE = 16000
CHUNK_S = 30
MEL_BINS = 128
HOP = 160
N_FFT = 400
FRAME_RATE = 12.5  # audio tokens a second: 100 mel frames / 2 (conv stride) / 4 (projector)
DOWNSAMPLE = 4
HEAD_DIM = 32
ENC_DIM = 2 * HEAD_DIM
HIDDEN = 2 * HEAD_DIM
N_SPECIAL = 100
# the ranks the released tekken.json gives them (transformers' VoxtralProcessor hard-codes [AUDIO] = 24)
NAMED_SPECIAL = {
    0: "<unk>",
    1: "<s>",
    2: "</s>",
    3: "[INST]",
    4: "[/INST]",
    5: "[AVAILABLE_TOOLS]",
    6: "[/AVAILABLE_TOOLS]",
    7: "[TOOL_RESULTS]",
    8: "[/TOOL_RESULTS]",
    9: "[TOOL_CALLS]",
    10: "[IMG]",
    11: "<pad>",
    12: "[IMG_BREAK]",
    13: "[IMG_END]",
    14: "[PREFIX]",
    15: "[MIDDLE]",
    16: "[SUFFIX]",
    17: "[SYSTEM_PROMPT]",
    18: "[/SYSTEM_PROMPT]",
    19: "[TOOL_CONTENT]",
    20: "[ARGS]",
    21: "[CALL_ID]",
    24: "[AUDIO]",
    25: "[BEGIN_AUDIO]",
    34: "[TRANSCRIBE]",
}
NAMED_SPECIAL_ID = {name: rank for rank, name in NAMED_SPECIAL.items()}
# Tekken's pre-tokenizer pattern (words, numbers, punctuation runs, whitespace)
PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+"
    r"[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# transformers' parameter name -> Mistral's (consolidated.safetensors), as regex and replacement; the encoder's
# sinusoidal position table has no Mistral name (vLLM computes it)
_ENC, _LM = "mm_whisper_embeddings.whisper_encoder", "model.language_model"
MISTRAL_NAMES = [
    (rf"{_LM}\.embed_tokens\.weight", "mm_whisper_embeddings.tok_embeddings.weight"),
    (rf"{_LM}\.layers\.(\d+)\.self_attn\.([qkvo])_proj\.weight", r"layers.\1.attention.w\2.weight"),
    (rf"{_LM}\.layers\.(\d+)\.input_layernorm\.weight", r"layers.\1.attention_norm.weight"),
    (rf"{_LM}\.layers\.(\d+)\.post_attention_layernorm\.weight", r"layers.\1.ffn_norm.weight"),
    (rf"{_LM}\.layers\.(\d+)\.mlp\.gate_proj\.weight", r"layers.\1.feed_forward.w1.weight"),
    (rf"{_LM}\.layers\.(\d+)\.mlp\.down_proj\.weight", r"layers.\1.feed_forward.w2.weight"),
    (rf"{_LM}\.layers\.(\d+)\.mlp\.up_proj\.weight", r"layers.\1.feed_forward.w3.weight"),
    (rf"{_LM}\.norm\.weight", "norm.weight"),
    (r"lm_head\.weight", "output.weight"),
    (r"model\.audio_tower\.conv1\.(weight|bias)", rf"{_ENC}.conv_layers.0.\1"),
    (r"model\.audio_tower\.conv2\.(weight|bias)", rf"{_ENC}.conv_layers.1.\1"),
    (
        r"model\.audio_tower\.layers\.(\d+)\.self_attn\.([qkv])_proj\.(weight|bias)",
        rf"{_ENC}.transformer.layers.\1.attention.w\2.\3",
    ),
    (
        r"model\.audio_tower\.layers\.(\d+)\.self_attn\.out_proj\.(weight|bias)",
        rf"{_ENC}.transformer.layers.\1.attention.wo.\2",
    ),
    (
        r"model\.audio_tower\.layers\.(\d+)\.self_attn_layer_norm\.(weight|bias)",
        rf"{_ENC}.transformer.layers.\1.attention_norm.\2",
    ),
    (
        r"model\.audio_tower\.layers\.(\d+)\.final_layer_norm\.(weight|bias)",
        rf"{_ENC}.transformer.layers.\1.ffn_norm.\2",
    ),
    (
        r"model\.audio_tower\.layers\.(\d+)\.fc([12])\.(weight|bias)",
        rf"{_ENC}.transformer.layers.\1.feed_forward.w\2.\3",
    ),
    (r"model\.audio_tower\.layer_norm\.(weight|bias)", rf"{_ENC}.transformer.norm.\1"),
    (r"model\.multi_modal_projector\.linear_1\.weight", "mm_whisper_embeddings.audio_language_projection.0.weight"),
    (r"model\.multi_modal_projector\.linear_2\.weight", "mm_whisper_embeddings.audio_language_projection.2.weight"),
]
NO_MISTRAL_NAME = {"model.audio_tower.embed_positions.weight"}


def mistral_name(name: str) -> str:
    for pattern, repl in MISTRAL_NAMES:
        if re.fullmatch(pattern, name):
            return re.sub(pattern, repl, name)
    raise KeyError(f"no Mistral name for {name!r}")


def _interleave(w, n_heads: int):
    """transformers' rotary layout (each head's halves) -> Mistral's (pairs side by side), the order vLLM's
    Mistral loader permutes back."""
    out, inp = w.shape
    return w.view(n_heads, 2, out // n_heads // 2, inp).transpose(1, 2).reshape(out, inp)


def to_mistral(state: dict[str, Any], n_heads: int, n_kv_heads: int) -> dict[str, Any]:
    """transformers' state dict -> Mistral's names and rotary order (tensors shared where unchanged)."""
    out = {}
    for name, w in state.items():
        if name in NO_MISTRAL_NAME:
            continue
        new = mistral_name(name)
        if new.startswith("layers.") and new.endswith((".wq.weight", ".wk.weight")):
            w = _interleave(w, n_heads if new.endswith(".wq.weight") else n_kv_heads)
        out[new] = w.contiguous()
    return out


def tekken(audio: bool = True) -> dict[str, Any]:
    """A byte-level tekken.json: the special tokens, then the 256 bytes as the whole text vocabulary."""
    specials = [
        {"rank": i, "token_str": NAMED_SPECIAL.get(i, f"<SPECIAL_{i}>"), "is_control": True} for i in range(N_SPECIAL)
    ]
    vocab = [{"rank": i, "token_bytes": base64.b64encode(bytes([i])).decode(), "token_str": None} for i in range(256)]
    data: dict[str, Any] = {
        "config": {
            "pattern": PATTERN,
            "num_vocab_tokens": len(vocab),
            "default_vocab_size": N_SPECIAL + len(vocab),
            "default_num_special_tokens": N_SPECIAL,
            "version": "v7",
        },
        "vocab": vocab,
        "special_tokens": specials,
    }
    if audio:
        data["audio"] = {
            "sampling_rate": SAMPLE_RATE,
            "frame_rate": FRAME_RATE,
            "chunk_length_s": float(CHUNK_S),
            "transcription_format": "instruct",
            "audio_encoding_config": {"num_mel_bins": MEL_BINS, "hop_length": HOP, "window_size": N_FFT},
        }
    return data


def params_json(config) -> dict[str, Any]:
    """Mistral's params.json for a transformers VoxtralConfig (the keys vLLM's Mistral config reader maps)."""
    text, audio = config.text_config, config.audio_config
    return {
        "dim": text.hidden_size,
        "n_layers": text.num_hidden_layers,
        "head_dim": text.head_dim,
        "hidden_dim": text.intermediate_size,
        "n_heads": text.num_attention_heads,
        "n_kv_heads": text.num_key_value_heads,
        "rope_theta": text.rope_parameters["rope_theta"],
        "norm_eps": text.rms_norm_eps,
        "vocab_size": text.vocab_size,
        "tied_embeddings": False,
        "max_seq_len": text.max_position_embeddings,
        "max_position_embeddings": text.max_position_embeddings,
        "multimodal": {
            "whisper_model_args": {
                "encoder_args": {
                    "audio_encoding_args": {
                        "sampling_rate": SAMPLE_RATE,
                        "num_mel_bins": audio.num_mel_bins,
                        "hop_length": HOP,
                        "window_size": N_FFT,
                    },
                    "dim": audio.hidden_size,
                    "n_layers": audio.num_hidden_layers,
                    "head_dim": audio.hidden_size // audio.num_attention_heads,
                    "hidden_dim": audio.intermediate_size,
                    "n_heads": audio.num_attention_heads,
                    "vocab_size": audio.vocab_size,
                    "max_source_positions": audio.max_source_positions,
                },
                "downsample_args": {"downsample_factor": DOWNSAMPLE},
            }
        },
    }


def build(outdir: Path, *, seed: int = 0) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import VoxtralConfig, VoxtralForConditionalGeneration, WhisperFeatureExtractor
    from transformers.models.whisper.modeling_whisper import sinusoids

    outdir = Path(outdir)
    vocab = N_SPECIAL + 256
    frames = CHUNK_S * SAMPLE_RATE // HOP  # 3000 mel frames a window; the conv stride halves them
    wide = 0.3  # a wide init gives peaked logits, so greedy choices are not near-ties
    config = VoxtralConfig(
        audio_config=dict(
            hidden_size=ENC_DIM,
            intermediate_size=ENC_DIM * DOWNSAMPLE,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_mel_bins=MEL_BINS,
            max_source_positions=frames // 2,
            initializer_range=wide,
        ),  # (its vocab_size stays Whisper's, as released: unused)
        text_config=dict(
            decoder(vocab, HIDDEN, head_dim=HEAD_DIM, max_positions=2048),
            rope_parameters={"rope_type": "default", "rope_theta": 100000000.0},
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=2,
            pad_token_id=11,
            initializer_range=wide,
        ),
        audio_token_id=NAMED_SPECIAL_ID["[AUDIO]"],
        torch_dtype="float32",
        architectures=["VoxtralForConditionalGeneration"],
    )
    torch.manual_seed(seed)
    model = VoxtralForConditionalGeneration(config).to(torch.float32).eval()
    with torch.no_grad():  # every tensor drawn, seeded (transformers 5 may leave some torch.empty)
        gen = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():
            if name in NO_MISTRAL_NAME:
                p.copy_(sinusoids(*p.shape))  # Whisper's fixed table, the one vLLM computes for Mistral's layout
            elif p.dim() == 1:
                p.copy_(torch.ones_like(p) if "norm" in name and name.endswith("weight") else torch.zeros_like(p))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * wide)
        # a random head would write control tokens and stray bytes as often as text; small rows keep it to
        # printable ASCII and </s>, as a trained model writes text (the bytes are ids N_SPECIAL + byte)
        quiet = [
            i
            for i in range(vocab)
            if i != NAMED_SPECIAL_ID["</s>"] and not (i >= N_SPECIAL and 32 <= i - N_SPECIAL < 127)
        ]
        model.lm_head.weight[quiet] *= 0.05
    model.save_pretrained(outdir)
    text = config.text_config
    save_file(
        to_mistral(model.state_dict(), text.num_attention_heads, text.num_key_value_heads),
        str(outdir / "consolidated.safetensors"),
        metadata={"format": "pt"},
    )
    (outdir / "params.json").write_text(json.dumps(params_json(config), indent=2) + "\n")
    (outdir / "tekken.json").write_text(json.dumps(tekken()) + "\n")
    WhisperFeatureExtractor(
        feature_size=MEL_BINS, sampling_rate=SAMPLE_RATE, hop_length=HOP, chunk_length=CHUNK_S, n_fft=N_FFT
    ).save_pretrained(outdir)
