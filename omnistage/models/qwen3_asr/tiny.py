"""Tiny Qwen3-ASR (``Qwen3ASRForConditionalGeneration``, transformers' layout, which vLLM 0.32 loads too).

The real transformers classes — the AuT audio encoder (windowed attention over 100-frame chunks), the
two-layer projector, a Qwen3 language model — with random (seeded) float32 weights, head size 32 (vLLM's
CPU attention takes 32/64/128), a locally trained Qwen2 tokenizer holding the release's special tokens
(``<|audio_start|>`` / ``<|audio_pad|>`` / ``<|audio_end|>``, ``<asr_text>``), the 128-bin
``Qwen3ASRFeatureExtractor`` at 16 kHz and a ChatML template. No downloads:

    python -m omnistage.testing.tiny qwen3_asr DIR
"""

from __future__ import annotations

import string
from pathlib import Path

from omnistage.models.shared.tiny.qwen_omni import QWEN3_AUDIO, QWEN3_AUDIO_TOKENS, audio_encoder
from omnistage.models.shared.tiny.sizes import decoder

HEAD_DIM = 32
HIDDEN = 2 * HEAD_DIM
MEL_BINS = 128
SAMPLE_RATE = 16000

SPECIAL_TOKENS = [*QWEN3_AUDIO_TOKENS, "<timestamp>"]
# added but not special, as in the released tokenizer: decoded text keeps it (vLLM's server and transformers'
# ``parse_output`` find the language prefix's end by it in text decoded without special tokens)
TEXT_TOKENS = ["<asr_text>"]
NAMED_TOKENS = {
    "audio_token": "<|audio_pad|>",
    "audio_bos_token": "<|audio_start|>",
    "audio_eos_token": "<|audio_end|>",
}  # attributes Qwen3ASRProcessor reads off the tokenizer
# ChatML turns; an audio part is the placeholder the processor expands
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'audio' %}<|audio_start|><|audio_pad|><|audio_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_CORPUS = [
    "<|im_start|>user\n<|audio_start|><|audio_pad|><|audio_end|><|im_end|>\n<|im_start|>assistant\n",
    "language English<asr_text>the quick brown fox jumps over the lazy dog",
    "language German<asr_text>speech recognition turns spoken words into written text",
    string.ascii_letters + string.digits + string.punctuation + " \n",
]


def train_tokenizer(vocab_size: int = 400):
    from transformers import Qwen2Tokenizer

    tok = Qwen2Tokenizer().train_new_from_iterator(
        _CORPUS * 40, vocab_size=vocab_size, new_special_tokens=SPECIAL_TOKENS
    )
    tok.add_tokens(TEXT_TOKENS)
    tok.chat_template = CHAT_TEMPLATE
    tok.eos_token = "<|im_end|>"
    tok.pad_token = "<|endoftext|>"
    return tok


def build(outdir: Path, *, seed: int = 0) -> None:
    import torch
    from transformers import (
        AutoTokenizer,
        GenerationConfig,
        Qwen3ASRConfig,
        Qwen3ASRFeatureExtractor,
        Qwen3ASRForConditionalGeneration,
        Qwen3ASRProcessor,
    )

    outdir = Path(outdir)
    tok = train_tokenizer()
    ids = tok.convert_tokens_to_ids
    eos, pad = ids("<|im_end|>"), ids("<|endoftext|>")
    wide = 0.3  # a wide init gives peaked logits, so greedy choices are not near-ties
    config = Qwen3ASRConfig(
        # max_source_positions and conv_chunksize are read by vLLM's encoder (transformers' takes its defaults)
        audio_config=audio_encoder(MEL_BINS, HEAD_DIM, HIDDEN, 50, wide, n_window_infer=800, **QWEN3_AUDIO),
        text_config=dict(
            decoder(len(tok), HIDDEN, head_dim=HEAD_DIM, max_positions=2048),
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            initializer_range=wide,
            pad_token_id=pad,
            eos_token_id=eos,
            tie_word_embeddings=True,
        ),
        audio_token_id=ids("<|audio_pad|>"),
        timestamp_token_id=ids("<timestamp>"),
        pad_token_id=pad,
        eos_token_id=[pad, eos],
        initializer_range=wide,
        tie_word_embeddings=True,
        torch_dtype="float32",
        architectures=["Qwen3ASRForConditionalGeneration"],
    )
    torch.manual_seed(seed)
    model = Qwen3ASRForConditionalGeneration(config).to(torch.float32).eval()
    with torch.no_grad():  # every tensor drawn, seeded (transformers 5 may leave some torch.empty)
        gen = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.ones_like(p) if "norm" in name and name.endswith("weight") else torch.zeros_like(p))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * wide)
    model.save_pretrained(outdir)
    GenerationConfig(eos_token_id=[pad, eos], pad_token_id=pad, bos_token_id=pad).save_pretrained(outdir)
    tok.save_pretrained(outdir)
    tok = AutoTokenizer.from_pretrained(str(outdir), extra_special_tokens=NAMED_TOKENS)
    features = Qwen3ASRFeatureExtractor(feature_size=MEL_BINS, sampling_rate=SAMPLE_RATE)
    Qwen3ASRProcessor(feature_extractor=features, tokenizer=tok, chat_template=CHAT_TEMPLATE).save_pretrained(outdir)
    tok.save_pretrained(outdir)
