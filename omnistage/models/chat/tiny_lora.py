"""A PEFT LoRA adapter for the tiny chat model (``python -m omnistage.testing.tiny chat_lora DIR``).

Written by PEFT itself (``adapter_config.json`` + ``adapter_model.safetensors``, the layout vLLM's
``LoRARequest`` loads), with random non-zero A and B on the attention and MLP projections, so that
greedy text with the adapter differs from the base model's.
"""

from __future__ import annotations

from pathlib import Path

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build(
    outdir: Path,
    *,
    seed: int = 0,
    rank: int = 8,
    alpha: int = 16,
    std: float = 0.2,
    targets: list[str] | None = None,
    **model: int,
) -> None:
    """``model``: the size arguments the base model was built with (``tiny.build``'s)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2ForCausalLM

    from omnistage.models.chat.tiny import model_config, train_tokenizer

    config = model_config(train_tokenizer(), **model)
    base = Qwen2ForCausalLM(config).eval()  # only its shapes matter: the adapter is saved alone
    peft_model = get_peft_model(
        base, LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets or TARGETS, init_lora_weights=False)
    )
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    peft_model.save_pretrained(str(outdir))
