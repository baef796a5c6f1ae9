"""Qwen3's tokenizer at toy size, with its chat template (Z-Image's and Ovis-Image's text encoders are Qwen3)."""

from __future__ import annotations

from omnistage.models.shared.tiny.sizes import decoder
from omnistage.stages.diffusion import tiny_parts as parts

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]


# Qwen3's template for one user turn (ZImagePipeline renders it with enable_thinking=True)
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


def tokenizer(vocab_size: int = 300):
    from transformers import Qwen2Tokenizer

    tok = Qwen2Tokenizer().train_new_from_iterator(
        parts._CORPUS * 4, vocab_size=vocab_size, new_special_tokens=SPECIAL_TOKENS
    )
    tok.pad_token = "<|endoftext|>"
    tok.chat_template = CHAT_TEMPLATE
    return tok


def text_encoder(vocab_size: int, hidden: int = 32):
    """A ``Qwen3Model`` at toy size (Z-Image's and Ovis-Image's text encoder)."""
    from transformers import Qwen3Config, Qwen3Model

    return Qwen3Model(Qwen3Config(**decoder(vocab_size, hidden, head_dim=16))).eval()
