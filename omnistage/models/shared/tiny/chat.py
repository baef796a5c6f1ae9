"""A byte-level BPE tokenizer with Qwen's chat tokens and template, trained locally on a small corpus (the chat LM's, VibeVoice's)."""

from __future__ import annotations

import string
from collections.abc import Sequence

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


_CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a photo of a red cat sitting on a blue chair in the sun",
    "hello world, how are you today? i am fine, thank you.",
    "describe a beautiful landscape with mountains, rivers and trees",
    string.ascii_letters + string.digits + string.punctuation + " \n",
]


def train_tokenizer(vocab_size: int = 384, extra_special_tokens: Sequence[str] = ()):
    """``extra_special_tokens``: e.g. a multimodal model's placeholder tokens (never split)."""
    from transformers import Qwen2Tokenizer

    tok = Qwen2Tokenizer().train_new_from_iterator(
        _CORPUS * 20, vocab_size=vocab_size, new_special_tokens=SPECIAL_TOKENS + list(extra_special_tokens)
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok
