"""Tiny VoxCPM2 folder, in the release's layout: ``config.json`` (``architecture: voxcpm2``, the release's
config schema), ``model.safetensors`` (the LMs, local encoder, local DiT and projections),
``audiovae.safetensors`` (the audio VAE) and a Llama tokenizer.

    python -m omnistage.testing.tiny voxcpm DIR

The weights are written from this family's modules (the release's parameter names and shapes, random seeded
float32 values); the release's own loader (``VoxCPM2Model.from_local``, run in the reference environment,
``scripts/reference/voxcpm/``) loads every key of it. Structure follows the release where it matters
(MiniCPM-4 with LongRoPE and muP scaling, a residual LM, a 2-token-conditioned local DiT, a 16 kHz-in /
24 kHz-out causal VAE with rate conditioning); sizes are toy ones (width 64, patches of 2 latent frames of
16 channels, 250 latent frames per second).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

HEAD_DIM = 16
STOP_MARGIN = 0.02
STOP_SPREAD = 0.04
LM = {
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "max_position_embeddings": 2048,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "rope_scaling": {
        "type": "longrope",
        "long_factor": [1.0 + 0.25 * i for i in range(HEAD_DIM // 2)],
        "short_factor": [1.0 + 0.125 * i for i in range(HEAD_DIM // 2)],
        "original_max_position_embeddings": 1024,
    },
    "vocab_size": 320,
    "use_mup": True,
    "scale_emb": 12,
    "dim_model_base": 32,
    "scale_depth": 1.4,
    "rope_theta": 10000.0,
}
CONFIG = {
    "architecture": "voxcpm2",
    "lm_config": LM,
    "patch_size": 2,
    "feat_dim": 16,
    "residual_lm_num_layers": 1,
    "residual_lm_no_rope": False,
    "scalar_quantization_latent_dim": 16,
    "scalar_quantization_scale": 9,
    "encoder_config": {"hidden_dim": 32, "ffn_dim": 64, "num_heads": 2, "num_layers": 1},
    "dit_config": {
        "hidden_dim": 32,
        "ffn_dim": 64,
        "num_heads": 2,
        "num_layers": 2,
        "dit_mean_mode": False,
        "cfm_config": {"sigma_min": 1e-6, "solver": "euler", "t_scheduler": "log-norm", "inference_cfg_rate": 2.0},
    },
    "audio_vae_config": {
        "encoder_dim": 8,
        "encoder_rates": [2, 4, 8],
        "latent_dim": 16,
        "decoder_dim": 32,
        "decoder_rates": [4, 4, 6],
        "depthwise": True,
        "sample_rate": 16000,
        "out_sample_rate": 24000,
        "use_noise_block": False,
        "sr_bin_boundaries": [20000, 30000, 40000],
        "cond_type": "scale_bias",
        "cond_dim": 128,
        "cond_out_layer": False,
    },
    "max_length": 1024,
    "device": "cpu",
    "dtype": "float32",
}
_CORPUS = [
    "hello world, this is a tiny speech model.",
    "the quick brown fox jumps over the lazy dog",
    "voice cloning from a short clip and its transcript",
    "你好世界，今天天气很好。我们一起说话吧。",
    "numbers 0123456789 and punctuation !?.,;:'\"-",
]


def _tokenizer(outdir: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaTokenizerFast

    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Metaspace()
    tk.decoder = decoders.Metaspace()
    specials = ["<unk>", "<s>", "</s>"]
    trainer = trainers.BpeTrainer(vocab_size=LM["vocab_size"], special_tokens=specials, show_progress=False)
    tk.train_from_iterator(_CORPUS * 10, trainer)
    tok = LlamaTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tok.save_pretrained(str(outdir))


def _init(module, seed: int) -> None:
    import torch

    from omnistage.models.voxcpm.vae import WNConv

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "alpha":
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif leaf == "weight" and p.dim() == 1 or "scale_embed" in name:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p[0].numel()))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
        for m in module.modules():  # weight-normed convolutions: g the norm of v, so the weight is v
            if isinstance(m, WNConv):
                m.weight_g.copy_(m.weight_v.flatten(1).norm(dim=1).view(-1, 1, 1))


def _state(module) -> dict:
    return {k: v.contiguous() for k, v in module.state_dict().items()}


def build(outdir: Path) -> None:
    from safetensors.torch import save_file

    from omnistage.models.voxcpm.model import Backbone
    from omnistage.models.voxcpm.vae import AudioVAE

    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "config.json").write_text(json.dumps(CONFIG, indent=2))
    import torch

    backbone, vae = Backbone(CONFIG), AudioVAE(CONFIG["audio_vae_config"])
    _init(backbone, 0)
    _init(vae, 1)
    with torch.no_grad():
        # the stop head's "stop" logit a little under its "go on" one: speech of a few dozen patches, not 3
        noise = torch.randn(LM["hidden_size"], generator=torch.Generator().manual_seed(2))
        backbone.stop_head.weight[1] = backbone.stop_head.weight[0] + STOP_SPREAD * noise - STOP_MARGIN
        vae.decoder.model[-2].weight_g.mul_(0.1)  # the last conv: audio well inside tanh's range, not clipped
    save_file(_state(backbone), str(outdir / "model.safetensors"))
    save_file(_state(vae), str(outdir / "audiovae.safetensors"))
    _tokenizer(outdir)
