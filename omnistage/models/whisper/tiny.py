"""Tiny Whisper (encoder-decoder, audio in, text out) with a locally trained tokenizer.

The real ``WhisperForConditionalGeneration`` architecture with random (seeded) float32 weights, head size
32 (vLLM's CPU attention takes 32/64/128), the real special-token set (99 languages, task tokens,
``<|notimestamps|>`` and the 1501 timestamp tokens ``<|0.00|>`` .. ``<|30.00|>``), an 80-bin Whisper
feature extractor over 30 s windows at 16 kHz, and a generation config carrying the fields
``WhisperForConditionalGeneration.generate`` reads (``lang_to_id``, ``task_to_id``,
``no_timestamps_token_id``). Its timestamp tokens are all but never predicted (small embedding rows),
as a real model's after ``<|notimestamps|>``. No suppressed tokens: vLLM does not apply ``suppress_tokens``, and the
tests compare it with transformers. No downloads:

    python -m omnistage.testing.tiny whisper DIR
"""

from __future__ import annotations

import string
from pathlib import Path

from omnistage.models.shared.whisper.prompt import LANGUAGES, SAMPLE_RATE
from omnistage.models.shared.whisper.prompt import WINDOW_S as CHUNK_S

MEL_BINS = 80
HOP = 160
_TEXT_VOCAB = 400
_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, how are you today? i am fine, thank you.",
    "speech recognition turns spoken words into written text",
    string.ascii_letters + string.digits + string.punctuation + " \n",
]


def special_tokens() -> list[str]:
    """Whisper's special tokens in the released checkpoints' order."""
    return (
        ["<|endoftext|>", "<|startoftranscript|>"]
        + [f"<|{code}|>" for code in LANGUAGES]
        + ["<|translate|>", "<|transcribe|>"]
        + ["<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]
        + [f"<|{i * 0.02:.2f}|>" for i in range(1501)]
    )


def train_tokenizer():
    """A byte-level BPE over a small corpus with Whisper's special tokens *after* the text vocabulary, as in
    the released checkpoints (transformers' ``get_prompt_ids`` relies on that order)."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import WhisperTokenizer

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(
        _CORPUS * 20,
        trainers.BpeTrainer(
            vocab_size=_TEXT_VOCAB,
            special_tokens=[],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    tok = WhisperTokenizer(vocab=model["vocab"], merges=merges)  # adds <|endoftext|> right after the text
    tok.add_tokens([t for t in special_tokens() if t != "<|endoftext|>"], special_tokens=True)
    return tok


def build(outdir: Path, *, seed: int = 0, head_dim: int = 32, num_layers: int = 2) -> None:
    import torch
    from transformers import (
        GenerationConfig,
        WhisperConfig,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
        WhisperProcessor,
    )

    outdir = Path(outdir)
    tok = train_tokenizer()
    ids = tok.convert_tokens_to_ids
    eot, sot = ids("<|endoftext|>"), ids("<|startoftranscript|>")
    d_model = 2 * head_dim
    frames = CHUNK_S * SAMPLE_RATE // HOP
    config = WhisperConfig(
        vocab_size=len(tok),
        num_mel_bins=MEL_BINS,
        d_model=d_model,
        encoder_layers=num_layers,
        encoder_attention_heads=2,
        encoder_ffn_dim=2 * d_model,
        decoder_layers=num_layers,
        decoder_attention_heads=2,
        decoder_ffn_dim=2 * d_model,
        max_source_positions=frames // 2,
        max_target_positions=448,
        # A wide init gives peaked logits, so greedy choices are not near-ties.
        init_std=0.3,
        pad_token_id=eot,
        bos_token_id=eot,
        eos_token_id=eot,
        decoder_start_token_id=sot,
        begin_suppress_tokens=None,
        suppress_tokens=None,
        tie_word_embeddings=True,
        torch_dtype="float32",
        architectures=["WhisperForConditionalGeneration"],
    )
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(config).to(torch.float32).eval()
    with torch.no_grad():  # every tensor initialised (see omnistage/testing/tiny.py): re-draw them all, seeded
        gen = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():
            if name.endswith("embed_positions.weight") and "encoder" in name:
                continue  # the encoder's sinusoidal table is fixed, not learnt
            if p.dim() == 1:
                p.copy_(torch.ones_like(p) if "layer_norm" in name and name.endswith("weight") else torch.zeros_like(p))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        # A real Whisper never writes a timestamp token after <|notimestamps|>; a random one would (they are
        # 1501 of the ~2000 ids), and transformers' generate would then seek as if segments ended there.
        # Small rows in the tied embedding keep their logits low.
        first_ts = ids("<|0.00|>")
        model.model.decoder.embed_tokens.weight[first_ts : first_ts + 1501] *= 0.05
    model.save_pretrained(outdir)
    GenerationConfig(
        decoder_start_token_id=sot,
        eos_token_id=eot,
        pad_token_id=eot,
        bos_token_id=eot,
        max_length=448,
        is_multilingual=True,
        lang_to_id={f"<|{c}|>": ids(f"<|{c}|>") for c in LANGUAGES},
        task_to_id={t: ids(f"<|{t}|>") for t in ("translate", "transcribe")},
        no_timestamps_token_id=ids("<|notimestamps|>"),
        prev_sot_token_id=ids("<|startofprev|>"),
        suppress_tokens=[],
        begin_suppress_tokens=[],
    ).save_pretrained(outdir)
    features = WhisperFeatureExtractor(
        feature_size=MEL_BINS, sampling_rate=SAMPLE_RATE, hop_length=HOP, chunk_length=CHUNK_S, n_fft=400
    )
    WhisperProcessor(feature_extractor=features, tokenizer=tok).save_pretrained(outdir)
    tok.save_pretrained(outdir)
