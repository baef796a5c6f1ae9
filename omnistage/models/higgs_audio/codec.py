"""Higgs Audio v2's decoder stage: the audio tokenizer's decode path (``HiggsAudioV2TokenizerModel.decode``:
residual VQ lookup -> ``fc2`` -> the DAC decoder with the release's changes), from the checkpoint's
``audio_tokenizer/`` weights, without the encoder side (whose model class imports torchaudio).

The DAC decoder is convolutional with point-wise activations and no normalisation across time: a sample
depends on the codes within ``receptive_frames`` of its frame on either side, and on nothing else. A streamed
block decoded with that many frames before and after it equals the whole decode up to float rounding
(``CodecDecoderAdapter``'s non-causal schedule with exact context).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from omnistage.models.higgs_audio.config import CHUNK_FRAMES, INITIAL_CHUNK_FRAMES
from omnistage.models.shared.codec_lm.config import TTSConfig
from omnistage.models.shared.codec_lm.decoder import CodecDecoderAdapter
from omnistage.pipeline import StageContext


def dac_receptive_frames(cfg) -> int:
    """Frames on either side of a frame that can change its samples (DAC decoder: kernel-7 convolutions,
    a transposed convolution of kernel 2s per upsampling stride s, residual units of dilations 1, 3, 9)."""
    frames = 3.0  # first convolution, kernel 7, at the frame rate
    rate = 1  # steps per frame at the current layer
    for s in cfg.upsampling_ratios:
        frames += math.ceil((2 * s - 1) / s) / rate  # transposed conv: kernel 2s over inputs at this rate
        rate *= s
        frames += 3 * (1 + 3 + 9) / rate  # three residual units, kernel 7
    frames += 3 / rate  # last convolution, kernel 7
    return math.ceil(frames) + 1


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
        self.receptive_frames = dac_receptive_frames(cfg.acoustic_model_config)

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, K, T] -> float32 audio [B, T * samples_per_frame]."""
        codes = codes.to(self.device)
        quantized = 0
        for i in range(self.num_quantizers):  # as the reference: each codebook's projection, summed in order
            quantized = quantized + self.project_out[i](self.embed[i][codes[:, i]])
        latent = self.fc2(quantized).transpose(1, 2)
        audio = self.decoder(latent)
        return audio[:, 0, : codes.shape[-1] * self.samples_per_frame].float().cpu()


class HiggsCodecAdapter(CodecDecoderAdapter):
    def __init__(self, ctx: StageContext):  # not super().__init__: that one reads a codec_tts folder
        if ctx.model is None:
            raise ValueError("higgs_audio needs a model folder")
        device = f"cuda:{ctx.devices[0]}" if ctx.devices and torch.cuda.is_available() else "cpu"
        self.codec = HiggsCodec(Path(ctx.model) / "audio_tokenizer", device)
        self.config = TTSConfig(
            codebook_size=self.codec.codebook_size,
            num_quantizers=self.codec.num_quantizers,
            chunk_frames=CHUNK_FRAMES,
            initial_chunk_frames=INITIAL_CHUNK_FRAMES,
        )
        # exact: every block decoded with the decoder's whole receptive field on both sides
        self.context = self.lookahead = self.codec.receptive_frames
        self.calls: list[int] = []
