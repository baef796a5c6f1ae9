"""Tiny Qwen2 causal LM with a locally trained tokenizer and a chat template.

Random (seeded) weights, head size 32 (supported by vLLM's CPU attention),
float32. Built in a few seconds, no downloads:

    python -m omnistage.testing.tiny chat DIR
"""

from __future__ import annotations

from pathlib import Path

from omnistage.models.shared.tiny.chat import train_tokenizer


def model_config(tok, *, head_dim: int = 32, num_layers: int = 2, max_position_embeddings: int = 1024):
    """The tiny Qwen2's config for a tokenizer from ``train_tokenizer``."""
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=len(tok),
        hidden_size=2 * head_dim,
        intermediate_size=4 * head_dim,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        # A wide init gives peaked logits, so greedy choices are not near-ties.
        initializer_range=0.3,
        bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
        architectures=["Qwen2ForCausalLM"],
    )


def build(
    outdir: Path, *, seed: int = 0, head_dim: int = 32, num_layers: int = 2, max_position_embeddings: int = 1024
) -> None:
    """``max_position_embeddings`` bounds vLLM's ``max_model_len`` (raise it for long-output runs)."""
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    outdir = Path(outdir)
    tok = train_tokenizer()
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    config = model_config(
        tok, head_dim=head_dim, num_layers=num_layers, max_position_embeddings=max_position_embeddings
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(outdir)
    GenerationConfig(
        eos_token_id=eos, bos_token_id=config.bos_token_id, pad_token_id=config.pad_token_id
    ).save_pretrained(outdir)
    tok.save_pretrained(outdir)
