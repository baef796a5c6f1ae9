"""A toy causal LM folder (the chat family's Qwen2, the codec TTS family's Qwen2 and Llama speech LMs): the
config, the seeded float32 weights, the generation config and the tokenizer, as the releases lay them out."""

from __future__ import annotations

from pathlib import Path

from omnistage.models.shared.tiny.sizes import decoder


def config(model_class, tok, *, head_dim: int, layers: int = 2, max_positions: int, bos: int, eos: int, pad: int):
    """``model_class``'s config: two heads of ``head_dim``, tied embeddings and a wide init (peaked logits, so
    greedy choices are not near-ties)."""
    return model_class.config_class(
        **decoder(len(tok), 2 * head_dim, layers=layers, head_dim=head_dim, max_positions=max_positions),
        tie_word_embeddings=True,
        initializer_range=0.3,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
        torch_dtype="float32",
        architectures=[model_class.__name__],
    )


def save(outdir: Path, model_class, config, tok, *, seed: int, eos: int, silent_end: bool = False) -> None:
    """``silent_end``: a zero (tied) embedding for ``eos``, whose logit is then 0, so that random weights rarely
    stop at once."""
    import torch
    from transformers import GenerationConfig

    torch.manual_seed(seed)
    model = model_class(config).to(torch.float32).eval()
    if silent_end:
        with torch.no_grad():
            model.get_input_embeddings().weight[eos] = 0
    model.save_pretrained(outdir)
    GenerationConfig(
        eos_token_id=eos, bos_token_id=config.bos_token_id, pad_token_id=config.pad_token_id
    ).save_pretrained(outdir)
    tok.save_pretrained(outdir)
