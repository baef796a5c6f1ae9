"""Mimi, Moshi's codec, as transformers' ``MimiModel`` loaded from the authors' checkpoint layout.

The authors keep Mimi in their own module names (``encoder.model.N.conv.conv``, fused attention projections,
``rvq_first`` / ``rvq_rest``) and their rotary embedding interleaves each head's dimensions in pairs, where
transformers' Mimi rotates its two halves: ``hf_state`` renames the keys and reorders the query/key rows from
pairs to halves (the same rotation, so attention scores are unchanged).

Streaming: Mimi is causal end to end with a bounded receptive field (``mimi_receptive_frames``), so a frame's
codes (encoding) or samples (decoding) computed over a window reaching that far back equal those of the whole
stream up to float rounding; ``StreamingMimi`` keeps each session's recent input in its slot and runs every
session's window as one batch.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import torch

from omnistage.models.shared.codec_lm.codec import mimi_receptive_frames

RENAMES = [
    (r"^(encoder|decoder)\.model\.(\d+)\.(?:conv\.conv|convtr\.convtr)\.", r"\1.layers.\2.conv."),
    (r"^(encoder|decoder)\.model\.(\d+)\.block\.(\d+)\.conv\.conv\.", r"\1.layers.\2.block.\3.conv."),
    (r"^(encoder|decoder)\.model\.(\d+)\.shortcut\.conv\.conv\.", r"\1.layers.\2.shortcut.conv."),
    (r"^downsample\.conv\.conv\.conv\.", "downsample.conv."),
    (r"^upsample\.convtr\.convtr\.convtr\.", "upsample.conv."),
    (r"^(\w+_transformer)\.transformer\.layers\.", r"\1.layers."),
    (r"\.self_attn\.out_projs\.0\.", ".self_attn.o_proj."),
    (r"\.self_attn\.out_proj\.", ".self_attn.o_proj."),
    (r"\.linear1\.", ".mlp.fc1."),
    (r"\.linear2\.", ".mlp.fc2."),
    (r"\.norm1\.", ".input_layernorm."),
    (r"\.norm2\.", ".post_attention_layernorm."),
    (r"\.layer_scale_1\.", ".self_attn_layer_scale."),
    (r"\.layer_scale_2\.", ".mlp_layer_scale."),
    (r"^quantizer\.rvq_first\.", "quantizer.semantic_residual_vector_quantizer."),
    (r"^quantizer\.rvq_rest\.", "quantizer.acoustic_residual_vector_quantizer."),
    (r"\.vq\.layers\.(\d+)\._codebook\.embedding_sum$", r".layers.\1.codebook.embed_sum"),
    (r"\.vq\.layers\.(\d+)\._codebook\.cluster_usage$", r".layers.\1.codebook.cluster_usage"),
    (r"\.vq\.layers\.(\d+)\._codebook\._initialized$", r".layers.\1.codebook.initialized"),
]
FUSED_QKV = re.compile(r"\.self_attn\.(?:in_projs\.0\.weight|in_proj_weight)$")


def hf_config(mimi: dict[str, Any]) -> Any:
    """transformers' ``MimiConfig`` for the authors' Mimi config (``seanet`` / ``quantizer`` / ``transformer``)."""
    from transformers import MimiConfig

    s, q, t = mimi["seanet"], mimi["quantizer"], mimi["transformer"]
    if t.get("gating", "none") != "none" or t.get("norm") != "layer_norm" or t.get("positional_embedding") != "rope":
        raise ValueError("moshi: Mimi transformer layout not supported (gelu FFN, layer_norm, rope expected)")
    return MimiConfig(
        sampling_rate=mimi["sample_rate"],
        frame_rate=mimi["frame_rate"],
        audio_channels=mimi["channels"],
        hidden_size=s["dimension"],
        num_filters=s["n_filters"],
        num_residual_layers=s["n_residual_layers"],
        upsampling_ratios=s["ratios"],
        kernel_size=s["kernel_size"],
        last_kernel_size=s["last_kernel_size"],
        residual_kernel_size=s["residual_kernel_size"],
        dilation_growth_rate=s["dilation_base"],
        use_causal_conv=s["causal"],
        pad_mode=s["pad_mode"],
        compress=s["compress"],
        use_conv_shortcut=not s["true_skip"],
        codebook_size=q["bins"],
        codebook_dim=q["dimension"],
        num_quantizers=q["n_q"],
        vector_quantization_hidden_dimension=q["dimension"],
        num_semantic_quantizers=1,
        upsample_groups=s["dimension"],  # the authors' upsampler is channel-wise
        num_hidden_layers=t["num_layers"],
        intermediate_size=t["dim_feedforward"],
        num_attention_heads=t["num_heads"],
        num_key_value_heads=t["num_heads"],
        head_dim=t["d_model"] // t["num_heads"],
        sliding_window=t["context"],
        layer_scale_initial_scale=t["layer_scale"],
        rope_parameters={"rope_type": "default", "rope_theta": float(t["max_period"])},
    )


def pairs_to_halves(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Reorder a projection's output rows per head from interleaved pairs (r0 i0 r1 i1 …) to halves (r… i…)."""
    out, inp = w.shape
    return w.view(heads, out // heads // 2, 2, inp).transpose(1, 2).reshape(out, inp)


def hf_state(state: dict[str, torch.Tensor], heads: int) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        for pattern, repl in RENAMES:
            key = re.sub(pattern, repl, key)
        if FUSED_QKV.search(key):
            prefix = FUSED_QKV.sub(".self_attn.", key)
            q, k, v = value.chunk(3, dim=0)
            out[prefix + "q_proj.weight"] = pairs_to_halves(q, heads)
            out[prefix + "k_proj.weight"] = pairs_to_halves(k, heads)
            out[prefix + "v_proj.weight"] = v
        else:
            out[key] = value
    return out


def load_mimi(weights: Path, mimi: dict[str, Any], device: str, dtype: torch.dtype) -> Any:
    from safetensors.torch import load_file
    from transformers import MimiModel

    cfg = hf_config(mimi)
    model = MimiModel(cfg)
    model.load_state_dict(hf_state(load_file(str(weights)), cfg.num_attention_heads), strict=True)
    return model.to(device=device, dtype=dtype).eval()


def streaming_mask(steps: int, per_frame: int, context: int) -> torch.Tensor:
    """The attention the authors' streaming transformer computes, as a [1, 1, steps, steps] boolean mask over a
    window starting at a frame boundary: each frame's ``per_frame`` steps arrive together and the KV cache is a
    ring of ``context`` entries, so a step sees the earlier steps still in the ring after its frame was written
    (the first step of a frame sees ``context - per_frame + 1`` steps, the last ``context``), not a plain
    sliding window."""
    q = torch.arange(steps).view(-1, 1)
    k = torch.arange(steps).view(1, -1)
    frame_end = (q // per_frame) * per_frame + per_frame - 1
    return ((k <= q) & (k > frame_end - context)).view(1, 1, steps, steps)


class StreamingMimi:
    """Frame-by-frame encoding (user audio -> codes) and decoding (model codes -> audio) of many sessions, each
    over a window of its recent frames that covers Mimi's receptive field (or its whole history while shorter):
    a causal stream's frame computed over such a window equals the whole stream's up to float rounding. Windows
    of one length run as one batch."""

    def __init__(self, model: Any, num_codebooks: int):
        self.model = model
        cfg = model.config
        self.num_codebooks = num_codebooks
        self.frame = int(round(cfg.sampling_rate / cfg.frame_rate))
        self.per_frame = int(cfg.encodec_frame_rate // cfg.frame_rate)  # transformer steps per frame
        self.context = int(cfg.sliding_window)
        self.window = max(mimi_receptive_frames(cfg), encoder_receptive_frames(cfg))
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype

    def _transformer(self, part: Any, x: torch.Tensor) -> torch.Tensor:
        mask = streaming_mask(x.shape[-1], self.per_frame, self.context).to(self.device)
        return part(x.transpose(1, 2), attention_mask=mask, return_dict=True).last_hidden_state.transpose(1, 2)

    @torch.no_grad()
    def encode_last(self, audio: torch.Tensor) -> torch.Tensor:
        """Windows of audio [B, n * frame] (the same n) -> the codes of each one's last frame [B, K]."""
        m = self.model
        emb = m.encoder(audio[:, None].to(self.device, self.dtype))
        emb = m.downsample(self._transformer(m.encoder_transformer, emb))
        codes = m.quantizer.encode(emb, self.num_codebooks)  # [K, B, n]
        return codes[:, :, -1].T.long().cpu()

    @torch.no_grad()
    def decode_last(self, codes: torch.Tensor) -> torch.Tensor:
        """Windows of codes [B, K, n] (the same n) -> the samples of each one's last frame [B, frame]."""
        m = self.model
        emb = m.upsample(m.quantizer.decode(codes.to(self.device)))
        audio = m.decoder(self._transformer(m.decoder_transformer, emb))
        n = codes.shape[-1]
        return audio[:, 0, (n - 1) * self.frame : n * self.frame].float().cpu()


def encoder_receptive_frames(cfg: Any) -> int:
    """A safe bound on how many earlier frames of audio can change a frame's codes: each encoder convolution's
    look-back in input samples (kernel span times the samples per step at its depth), the transformer's window
    and the downsampler's kernel at the encoder rate."""
    hop, samples = 1, cfg.kernel_size - 1
    for ratio in reversed(cfg.upsampling_ratios):
        for j in range(cfg.num_residual_layers):
            samples += (cfg.residual_kernel_size - 1) * cfg.dilation_growth_rate**j * hop
        samples += (2 * ratio - 1) * hop
        hop *= ratio
    samples += (cfg.last_kernel_size - 1) * hop
    samples += cfg.num_hidden_layers * cfg.sliding_window * hop + 3 * hop  # transformer window, downsampler
    return math.ceil(samples / (cfg.sampling_rate / cfg.frame_rate)) + 1
