"""The tiny Voxtral's two layouts hold the same tensors (no vLLM): every transformers parameter is in
consolidated.safetensors under its Mistral name, the LM's q/k rows in Mistral's interleaved rotary order; and
which folders the family claims.
"""

from __future__ import annotations

import json

import pytest

from omnistage.models.voxtral import matches
from omnistage.models.voxtral.tiny import mistral_name
from omnistage.pipeline import ModelFolder

# transformers' name -> Mistral's, written out for one layer of each kind (the fixture's table must agree)
EXPECTED = {
    "model.language_model.embed_tokens.weight": "mm_whisper_embeddings.tok_embeddings.weight",
    "model.language_model.layers.1.self_attn.q_proj.weight": "layers.1.attention.wq.weight",
    "model.language_model.layers.1.self_attn.k_proj.weight": "layers.1.attention.wk.weight",
    "model.language_model.layers.1.self_attn.o_proj.weight": "layers.1.attention.wo.weight",
    "model.language_model.layers.0.mlp.gate_proj.weight": "layers.0.feed_forward.w1.weight",
    "model.language_model.layers.0.mlp.down_proj.weight": "layers.0.feed_forward.w2.weight",
    "model.language_model.layers.0.mlp.up_proj.weight": "layers.0.feed_forward.w3.weight",
    "model.language_model.layers.0.input_layernorm.weight": "layers.0.attention_norm.weight",
    "model.language_model.layers.0.post_attention_layernorm.weight": "layers.0.ffn_norm.weight",
    "model.language_model.norm.weight": "norm.weight",
    "lm_head.weight": "output.weight",
    "model.audio_tower.conv2.bias": "mm_whisper_embeddings.whisper_encoder.conv_layers.1.bias",
    "model.audio_tower.layers.0.self_attn.v_proj.bias": "mm_whisper_embeddings.whisper_encoder.transformer.layers.0.attention.wv.bias",
    "model.audio_tower.layers.0.self_attn.out_proj.weight": "mm_whisper_embeddings.whisper_encoder.transformer.layers.0.attention.wo.weight",
    "model.audio_tower.layers.0.fc2.weight": "mm_whisper_embeddings.whisper_encoder.transformer.layers.0.feed_forward.w2.weight",
    "model.audio_tower.layers.0.final_layer_norm.bias": "mm_whisper_embeddings.whisper_encoder.transformer.layers.0.ffn_norm.bias",
    "model.audio_tower.layer_norm.weight": "mm_whisper_embeddings.whisper_encoder.transformer.norm.weight",
    "model.multi_modal_projector.linear_2.weight": "mm_whisper_embeddings.audio_language_projection.2.weight",
}


def halves_from_pairs(w, n_heads: int):
    """Mistral's rotary rows (per head: dim 0 of pair 0, dim 1 of pair 0, dim 0 of pair 1, ...) in
    transformers' order (per head: every pair's dim 0, then every pair's dim 1)."""
    import torch

    head = w.shape[0] // n_heads
    order = [h * head + 2 * j + k for h in range(n_heads) for k in (0, 1) for j in range(head // 2)]
    return w[torch.tensor(order)]


@pytest.fixture(scope="module")
def folder(tiny_model):
    return tiny_model("voxtral")


def test_layouts_hold_the_same_tensors(folder):
    import torch
    from safetensors.torch import load_file
    from transformers import VoxtralForConditionalGeneration

    # (transformers' module names, as loaded: its saved file spells them as the released checkpoints do)
    hf = VoxtralForConditionalGeneration.from_pretrained(folder).state_dict()
    mistral = load_file(str(folder / "consolidated.safetensors"))
    config = json.loads((folder / "config.json").read_text())["text_config"]
    for name, new in EXPECTED.items():
        assert mistral_name(name) == new
    seen = set()
    for name, w in hf.items():
        if name == "model.audio_tower.embed_positions.weight":
            assert name not in mistral  # sinusoidal: vLLM computes it
            continue
        new = mistral_name(name)
        got = mistral[new]
        if new.endswith(".wq.weight") and new.startswith("layers."):
            got = halves_from_pairs(got, config["num_attention_heads"])
        elif new.endswith(".wk.weight") and new.startswith("layers."):
            got = halves_from_pairs(got, config["num_key_value_heads"])
        assert torch.equal(got, w), name
        seen.add(new)
    assert seen == set(mistral)
    params = json.loads((folder / "params.json").read_text())
    assert params["dim"] == config["hidden_size"] and params["vocab_size"] == config["vocab_size"]


def write(path, name, data):
    path.mkdir(exist_ok=True)
    (path / name).write_text(json.dumps(data))
    return ModelFolder(path)


def test_the_family_claims_mistrals_offline_layout_only(folder, tmp_path):
    assert matches(ModelFolder(folder))
    encoder = {"dim": 64, "n_layers": 1}
    assert matches(
        write(tmp_path / "a", "params.json", {"multimodal": {"whisper_model_args": {"encoder_args": encoder}}})
    )
    # the realtime model (causal encoder) is another one; a text-only Mistral folder and transformers' layout
    # alone (which vLLM 0.32's Voxtral cannot load) are not this family's
    assert not matches(
        write(
            tmp_path / "b",
            "params.json",
            {"multimodal": {"whisper_model_args": {"encoder_args": {**encoder, "causal": True}}}},
        )
    )
    assert not matches(write(tmp_path / "c", "params.json", {"dim": 64}))
    assert not matches(write(tmp_path / "d", "config.json", {"architectures": ["VoxtralForConditionalGeneration"]}))
