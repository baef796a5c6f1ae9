"""Tiny Qwen2 causal LM with a locally trained tokenizer and a chat template.

Random (seeded) weights, head size 32 (supported by vLLM's CPU attention),
float32. Built in a few seconds, no downloads:

    python -m omnistage.testing.tiny chat DIR

The multimodal chat fixtures share its language model's fields and saving steps (``text_config``,
``save_multimodal``).
"""

from __future__ import annotations

from pathlib import Path

from omnistage.models.shared.tiny import causal_lm
from omnistage.models.shared.tiny.chat import train_tokenizer
from omnistage.models.shared.tiny.sizes import decoder


def model_config(tok, *, head_dim: int = 32, num_layers: int = 2, max_position_embeddings: int = 1024):
    """The tiny Qwen2's config for a tokenizer from ``train_tokenizer``."""
    from transformers import Qwen2ForCausalLM

    ids = tok.convert_tokens_to_ids
    return causal_lm.config(
        Qwen2ForCausalLM,
        tok,
        head_dim=head_dim,
        layers=num_layers,
        max_positions=max_position_embeddings,
        bos=ids("<|endoftext|>"),
        eos=ids("<|im_end|>"),
        pad=tok.pad_token_id,
    )


def build(
    outdir: Path, *, seed: int = 0, head_dim: int = 32, num_layers: int = 2, max_position_embeddings: int = 1024
) -> None:
    """``max_position_embeddings`` bounds vLLM's ``max_model_len`` (raise it for long-output runs)."""
    from transformers import Qwen2ForCausalLM

    tok = train_tokenizer()
    config = model_config(
        tok, head_dim=head_dim, num_layers=num_layers, max_position_embeddings=max_position_embeddings
    )
    causal_lm.save(Path(outdir), Qwen2ForCausalLM, config, tok, seed=seed, eos=config.eos_token_id)


def text_config(tok, hidden: int, num_layers: int, max_position_embeddings: int, **extra) -> dict:
    """The language model of the multimodal chat fixtures (audio, VLM, Qwen-VL): a wide init (peaked logits, so
    greedy choices are not near-ties), padded with its bos, untied (see ``ROOT``)."""
    bos, eos = tok.convert_tokens_to_ids("<|endoftext|>"), tok.convert_tokens_to_ids("<|im_end|>")
    sizes = decoder(len(tok), hidden, layers=num_layers, max_positions=max_position_embeddings)
    return dict(
        sizes,
        initializer_range=0.3,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=bos,
        tie_word_embeddings=False,
        **extra,
    )


# A multimodal config's own fields. Untied: vLLM ties the LM head only on text_config's flag, transformers on the root's.
ROOT = {"tie_word_embeddings": False, "torch_dtype": "float32"}


def save_multimodal(outdir: Path, model_class, config, seed: int) -> None:
    """Seeded float32 weights and the generation config (the text model's bos, eos and pad)."""
    import torch
    from transformers import GenerationConfig

    torch.manual_seed(seed)
    model = model_class(config).to(torch.float32).eval()
    model.save_pretrained(outdir)
    text = config.text_config
    GenerationConfig(
        eos_token_id=text.eos_token_id, bos_token_id=text.bos_token_id, pad_token_id=text.pad_token_id
    ).save_pretrained(outdir)
