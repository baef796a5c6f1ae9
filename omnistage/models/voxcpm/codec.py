"""VoxCPM2's decoder stage: the audio VAE's causal decoder, batched over requests and streamed.

Each call gets one new piece of latent frames [D, n] per request (the first may carry a continued clip's last
frames as ``context``: decoded in front, their samples dropped, as the release's whole decode does). The
decoder is causal, so a piece decoded with the ``receptive_frames`` before it equals the whole decode up to
float rounding; the windows of one call are right-padded into one batch (padding never reaches real samples).
"""

from __future__ import annotations

from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.codec_lm.decoder import positive_int, stage_params
from omnistage.models.shared.folder_engine import model_folder, stage_cuda_device
from omnistage.models.voxcpm.vae import AudioVAE
from omnistage.pipeline import StageContext, read_json
from omnistage.stages.generation.engine import GenerationItem

PARAM_KEYS = {"chunk_frames", "initial_codec_chunk_frames", "seed"}  # (chunk sizes: the edge reads them)


class VoxDecoderAdapter:
    def __init__(self, ctx: StageContext):
        from safetensors.torch import load_file

        folder = model_folder(ctx, "voxcpm")
        self.device = stage_cuda_device(ctx)
        self.vae = AudioVAE(read_json(folder / "config.json")["audio_vae_config"])
        self.vae.load_state_dict(load_file(str(folder / "audiovae.safetensors")))
        self.vae = self.vae.to(self.device).eval()
        self.hop = self.vae.decode_chunk_size
        self.context = self.vae.receptive_frames
        self.calls: list[int] = []  # rows of each decode call (tests look at it)

    def _latents(self, value: Any, field: str) -> torch.Tensor:
        x = torch.as_tensor(value)
        if x.dim() != 2 or x.shape[0] != self.vae.latent_dim or not x.is_floating_point():
            raise InvalidRequestError(
                field, f"expected float latents [{self.vae.latent_dim}, frames], got {tuple(x.shape)}"
            )
        return x.float()

    def _window(self, item: GenerationItem) -> tuple[torch.Tensor, int]:
        """The frames to decode for this piece and how many of them lead in (their samples are not emitted)."""
        params = stage_params(item, PARAM_KEYS, "sampling_params", "the decoder stage")
        for key in ("chunk_frames", "initial_codec_chunk_frames"):
            positive_int(params, key)
        new = self._latents(item.inputs.get("latents"), "latents")
        state = item.state
        if "held" not in state:
            ctx = item.inputs.get("context")
            state["held"] = self._latents(ctx, "context") if ctx is not None else new[:, :0]
        window = torch.cat([state["held"], new], dim=1)
        lead = state["held"].shape[1]
        state["held"] = window[:, -self.context :] if self.context else window[:, :0]
        return window, lead

    @torch.no_grad()
    def run(self, items: list[GenerationItem]) -> list[Any]:
        results: list[Any] = [None] * len(items)
        windows: list[tuple[int, torch.Tensor, int]] = []
        for i, item in enumerate(items):
            try:
                window, lead = self._window(item)
            except ValueError as e:
                results[i] = e
                continue
            windows.append((i, window, lead))
        if windows:
            longest = max(w.shape[1] for _, w, _ in windows)
            batch = torch.zeros(len(windows), self.vae.latent_dim, longest)
            for row, (_, w, _) in enumerate(windows):
                batch[row, :, : w.shape[1]] = w
            audio = self.vae.decode(batch.to(self.device)).cpu()
            self.calls.append(len(windows))
            for row, (i, w, lead) in enumerate(windows):
                results[i] = {
                    "audio": audio[row, lead * self.hop : w.shape[1] * self.hop].clone(),
                    "sample_rate": self.vae.out_sample_rate,
                }
        return results
