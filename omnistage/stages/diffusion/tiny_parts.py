"""Tiny real-architecture text-encoder parts shared by the diffusion families' fixtures.

Tokenizers are trained locally on a small corpus (with the whole alphabet, so
any test prompt tokenizes); weights are random but seeded.
"""

from __future__ import annotations

import json
import string

_CORPUS = [
    "a photo of a red cat sitting on a blue chair",
    "a watercolor painting of mountains at sunset",
    "an astronaut riding a horse on the moon",
    "a bowl of fruit, studio lighting, high detail",
    "city skyline at night with neon lights",
    "green square and yellow circle on a white background",
    " ".join(string.ascii_lowercase),
    " ".join(string.ascii_uppercase),
    " ".join(string.digits + string.punctuation),
]


def clip_tokenizer(vocab_size: int = 300, max_length: int = 77):
    from transformers import CLIPTokenizer

    tok = CLIPTokenizer().train_new_from_iterator(_CORPUS * 4, vocab_size=vocab_size)
    _canonical_word_ends(tok.backend_tokenizer)
    tok.model_max_length = max_length
    return tok


def _canonical_word_ends(backend) -> None:
    """Make a trained BPE model with an end-of-word suffix the same on every run. The trainer numbers the
    alphabet's word-final symbols (``a</w>``) in the order of Rust's randomly seeded hash maps: give the same
    ids to them sorted. (At the default ``vocab_size`` the alphabet alone is larger: no merges are learned.)"""
    from tokenizers import Tokenizer

    state = json.loads(backend.to_str())
    vocab, suffix = state["model"]["vocab"], state["model"]["end_of_word_suffix"]
    ends = sorted(t for t in vocab if t.endswith(suffix) and len(t) == len(suffix) + 1)
    for token, i in zip(ends, sorted(vocab[t] for t in ends), strict=True):
        vocab[token] = i
    backend.model = Tokenizer.from_str(json.dumps(state)).model


def t5_tokenizer(vocab_size: int = 300):
    from transformers import T5Tokenizer

    tok = T5Tokenizer().train_new_from_iterator(_CORPUS * 4, vocab_size=vocab_size)
    _canonical_unigram(tok.backend_tokenizer)
    return tok


def _canonical_unigram(backend) -> None:
    """Make a trained Unigram model the same on every run. The trainer sums float scores in the order of Rust's
    randomly seeded hash maps (parallel or not), so a score's last digits, and with them the order (the ids) of
    pieces whose scores tie, change from run to run. Round the scores far below any gap between two
    segmentations and sort the learned pieces by (score, piece); special tokens keep their ids."""
    from tokenizers.models import Unigram

    state = json.loads(backend.to_str())
    vocab = state["model"]["vocab"]
    special = {t["id"] for t in state["added_tokens"]}
    learned = iter(sorted(((p, round(s, 8)) for i, (p, s) in enumerate(vocab) if i not in special), key=_by_score))
    vocab = [(p, s) if i in special else next(learned) for i, (p, s) in enumerate(vocab)]
    backend.model = Unigram(vocab, unk_id=state["model"]["unk_id"], byte_fallback=state["model"]["byte_fallback"])


def _by_score(piece: tuple[str, float]) -> tuple[float, str]:
    return -piece[1], piece[0]


def clip_text_model(
    *, with_projection: bool, hidden: int = 32, projection_dim: int = 32, vocab_size: int = 1000, layers: int = 2
):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    cfg = CLIPTextConfig(
        hidden_size=hidden,
        intermediate_size=37,
        num_attention_heads=4,
        num_hidden_layers=layers,
        vocab_size=vocab_size,
        projection_dim=projection_dim,
        max_position_embeddings=77,
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=1,
    )
    cls = CLIPTextModelWithProjection if with_projection else CLIPTextModel
    return cls(cfg).eval()


def t5_encoder(d_model: int = 32, vocab_size: int = 1000):
    from transformers import T5Config, T5EncoderModel

    cfg = T5Config(
        d_model=d_model,
        d_kv=8,
        d_ff=37,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        vocab_size=vocab_size,
    )
    return T5EncoderModel(cfg).eval()
