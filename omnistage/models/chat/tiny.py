"""Tiny Qwen2 causal LM with a locally trained tokenizer and a chat template.

Random (seeded) weights, head size 32 (supported by vLLM's CPU attention),
float32. Built in a few seconds, no downloads:

    python -m omnistage.testing.tiny chat DIR
"""

from __future__ import annotations

import string
from pathlib import Path

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


def train_tokenizer(vocab_size: int = 384):
    from transformers import Qwen2Tokenizer

    tok = Qwen2Tokenizer().train_new_from_iterator(_CORPUS * 20, vocab_size=vocab_size,
                                                   new_special_tokens=SPECIAL_TOKENS)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build(outdir: Path, *, seed: int = 0, head_dim: int = 32, num_layers: int = 2) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    outdir = Path(outdir)
    tok = train_tokenizer()
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=2 * head_dim, intermediate_size=4 * head_dim,
        num_hidden_layers=num_layers, num_attention_heads=2, num_key_value_heads=1, head_dim=head_dim,
        max_position_embeddings=1024, tie_word_embeddings=True,
        # A wide init gives peaked logits, so greedy choices are not near-ties.
        initializer_range=0.3, bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"), eos_token_id=eos,
        pad_token_id=tok.pad_token_id, torch_dtype="float32", architectures=["Qwen2ForCausalLM"],
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(outdir)
    GenerationConfig(eos_token_id=eos, bos_token_id=config.bos_token_id, pad_token_id=config.pad_token_id).save_pretrained(outdir)
    tok.save_pretrained(outdir)
