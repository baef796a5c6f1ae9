"""Mistral 3 text encoders at toy size (FLUX.2 [dev]'s Mistral Small 3.1, ERNIE-Image's Ministral 3 encoder and
prompt enhancer), with a locally trained tokenizer in the shape of Mistral's."""

from __future__ import annotations

from collections.abc import Sequence

from omnistage.models.shared.tiny.sizes import decoder

# the tokens Mistral's chat templates and FLUX.2's ``format_input`` use (system turn, user turn, image placeholders)
SPECIAL = ["[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[IMG]", "[IMG_BREAK]", "[IMG_END]"]
# the shape of Mistral Small 3.1's template for system and user turns (content a string or a list of parts)
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% set text = m['content'] if m['content'] is string else "
    "m['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('') %}"
    "{% if m['role'] == 'system' %}[SYSTEM_PROMPT]{{ text }}[/SYSTEM_PROMPT]"
    "{% elif m['role'] == 'user' %}[INST]{% if m['content'] is not string %}"
    "{% for c in m['content'] if c['type'] == 'image' %}[IMG]{% endfor %}{% endif %}{{ text }}[/INST]"
    "{% else %}{{ text }}{{ eos_token }}{% endif %}{% endfor %}"
)
LAYERS = 30  # FLUX.2 [dev] stacks hidden states 10, 20 and 30


def tokenizer(vocab_size: int = 400, extra_corpus: Sequence[str] = ()):
    """A Llama-style tokenizer trained on the shared corpus (plus ``extra_corpus``) with Mistral's special tokens
    (``TEMPLATE`` is its chat template: set it where the model reads one from the tokenizer)."""
    from transformers import LlamaTokenizer

    from omnistage.stages.diffusion.tiny_parts import _CORPUS

    tok = LlamaTokenizer().train_new_from_iterator(
        (_CORPUS + list(extra_corpus)) * 4, vocab_size=vocab_size, new_special_tokens=SPECIAL
    )
    tok.pad_token = tok.unk_token
    return tok


def text_config(vocab_size: int, hidden: int = 16, layers: int = LAYERS) -> dict:
    sizes = decoder(vocab_size, hidden, layers=layers, head_dim=8)
    return dict(sizes, model_type="mistral", sliding_window=None)


def encoder(
    vocab_size: int, hidden: int = 16, layers: int = LAYERS, model_class: str = "Mistral3ForConditionalGeneration"
):
    """A Mistral 3 model (``model_class``: ``Mistral3ForConditionalGeneration`` or ``Mistral3Model``) with a
    one-layer Pixtral vision tower."""
    import transformers

    vision = dict(
        model_type="pixtral",
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        head_dim=8,
        patch_size=8,
        image_size=64,
    )
    config = transformers.Mistral3Config(
        text_config=text_config(vocab_size, hidden, layers), vision_config=vision, spatial_merge_size=1
    )
    return getattr(transformers, model_class)(config).eval()
