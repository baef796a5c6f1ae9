"""The Higgs Audio v2 audio tokenizer's decode path (``HiggsAudioV2TokenizerModel.decode``: residual VQ lookup
-> ``fc2`` -> the DAC decoder with the release's changes), from a checkpoint's ``audio_tokenizer/`` weights,
without the encoder side (whose model class imports torchaudio). Higgs Audio v2 and OmniVoice both decode
their codes with it.

The DAC decoder is convolutional with point-wise activations and no normalisation across time: a sample
depends on the codes within ``receptive_frames`` of its frame on either side, and on nothing else.
"""

from __future__ import annotations

from pathlib import Path

import torch

from omnistage.models.shared.dac_span import decode_span, receptive_frames


class HiggsCodec:
    causal = False

    def __init__(self, folder: Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        from torch import nn
        from transformers import AutoConfig, DacModel

        from omnistage.models.shared.checkpoint import read_tensors

        cfg = AutoConfig.from_pretrained(str(folder))
        acoustic = DacModel(cfg.acoustic_model_config).decoder
        for m in acoustic.modules():  # the release's DAC: odd strides pad their output, no final tanh
            if isinstance(m, nn.ConvTranspose1d):
                m.output_padding = (m.stride[0] % 2,)
        acoustic.tanh = nn.Identity()
        acoustic.load_state_dict(read_tensors(folder, "acoustic_decoder."), strict=True)
        tensors = read_tensors(folder, "")
        k = cfg.num_quantizers
        self.embed = torch.stack([tensors[f"quantizer.quantizers.{i}.codebook.embed"] for i in range(k)])
        self.project_out = nn.ModuleList(nn.Linear(cfg.codebook_dim, cfg.hidden_size) for _ in range(k))
        for i, proj in enumerate(self.project_out):
            proj.load_state_dict(
                {
                    "weight": tensors[f"quantizer.quantizers.{i}.project_out.weight"],
                    "bias": tensors[f"quantizer.quantizers.{i}.project_out.bias"],
                }
            )
        self.fc2 = nn.Linear(cfg.hidden_size, cfg.acoustic_model_config.hidden_size)
        self.fc2.load_state_dict({"weight": tensors["fc2.weight"], "bias": tensors["fc2.bias"]})
        self.decoder = acoustic.to(device=device, dtype=dtype).eval()
        self.project_out = self.project_out.to(device=device, dtype=dtype)
        self.fc2 = self.fc2.to(device=device, dtype=dtype)
        self.embed = self.embed.to(device=device, dtype=dtype)
        self.device = device
        self.sample_rate = int(cfg.sample_rate)
        self.num_quantizers = k
        self.codebook_size = int(cfg.codebook_size)
        self.samples_per_frame = int(cfg.hop_length)
        self.receptive_frames = receptive_frames(self.decoder)  # exact, both sides

    def _latent(self, codes: torch.Tensor) -> torch.Tensor:
        codes = codes.to(self.device)
        quantized = 0
        for i in range(self.num_quantizers):  # as the reference: each codebook's projection, summed in order
            quantized = quantized + self.project_out[i](self.embed[i][codes[:, i]])
        return self.fc2(quantized).transpose(1, 2)

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, K, T] -> float32 audio [B, T * samples_per_frame]."""
        audio = self.decoder(self._latent(codes))
        return audio[:, 0, : codes.shape[-1] * self.samples_per_frame].float().cpu()

    @torch.no_grad()
    def decode_span(self, codes: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """``decode(codes)[:, start:end]``, computing only what those samples depend on (``dac_span``)."""
        return decode_span(self.decoder, self._latent(codes), start, end)[:, 0].float().cpu()
