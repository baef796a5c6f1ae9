"""The token2wav stage's generation adapter: the talker's codes -> 24 kHz waveform (DiT flow sampler + BigVGAN).

The reference is transformers' ``Qwen2_5OmniToken2WavModel.forward(code, conditioning, reference_mel)`` as
``generate()`` calls it: the speaker's ``cond`` and ``ref_mel`` from ``spk_dict.pt``, the DiT sampled with
10 RK4 steps (guidance 0.5, sway -1) from Gaussian noise, then BigVGAN. transformers draws that noise from the
global RNG; this stage draws the same shape from the request's own generator (``seed``: the request's seed, or a
fresh one), so a seeded request gives transformers' waveform after ``torch.manual_seed(seed)`` (greedy thinker
and talker draw nothing before it) and the same waveform alone or beside others. The sampler loop is
transformers' ``Qwen2_5OmniToken2WavDiTModel.sample`` with the noise passed in (its own ``RungeKutta4ODESolver``).

The whole code sequence is decoded at once, as transformers does (the DiT attends across blocks on both sides),
so the stage starts when the talker finished; requests of one batch are decoded one after the other (each
sequence has its own length, and the DiT has no padding mask).
"""

from __future__ import annotations

from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.qwen2_5_omni.checkpoint import load_config, load_token2wav
from omnistage.models.qwen2_5_omni.config import (
    SAMPLE_RATE,
    TOKEN2WAV_DEFAULTS,
    TOKEN2WAV_PARAM_KEYS,
    load_omni25_config,
)
from omnistage.models.shared.codec_lm.decoder import stage_params
from omnistage.models.shared.folder_engine import model_folder, stage_cuda_device
from omnistage.pipeline import StageContext
from omnistage.stages.generation.engine import GenerationItem

DEFAULTS = TOKEN2WAV_DEFAULTS  # Token2WavModel.forward's
PARAM_KEYS = TOKEN2WAV_PARAM_KEYS


class Token2WavAdapter:
    def __init__(self, ctx: StageContext):
        folder = model_folder(ctx, "qwen2_5_omni")
        self.device = stage_cuda_device(ctx)
        self.omni = load_omni25_config(folder)
        self.model = load_token2wav(folder, load_config(folder), self.device)
        self.dit = self.model.code2wav_dit_model
        self.num_codes = self.dit.config.num_embeds + 1  # the DiT's codec embedding rows
        self.sample_rate = SAMPLE_RATE
        self.calls = 0  # decodes run (tests look at it)

    def params(self, item: GenerationItem) -> dict[str, Any]:
        params = stage_params(item, PARAM_KEYS, "sampling_params_list[2]", "token2wav")
        out = {**DEFAULTS, **{k: v for k, v in params.items() if v is not None and k != "seed"}}
        n = out["num_steps"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise InvalidRequestError("num_steps", f"expected an integer >= 2, got {n!r}")
        for key in ("guidance_scale", "sway_coefficient"):
            if isinstance(out[key], bool) or not isinstance(out[key], (int, float)):
                raise InvalidRequestError(key, f"expected a number, got {out[key]!r}")
        seed = params.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise InvalidRequestError("seed", f"expected a non-negative integer, got {seed!r}")
        out["seed"] = seed
        return out

    def codes(self, item: GenerationItem) -> torch.Tensor:
        codes = torch.as_tensor(item.inputs.get("codes"))
        if codes.dim() != 1 or codes.numel() == 0 or codes.dtype not in (torch.int64, torch.int32):
            raise InvalidRequestError("codes", f"expected a non-empty integer tensor [codes], got {tuple(codes.shape)}")
        if codes.min() < 0 or codes.max() >= self.num_codes:
            raise InvalidRequestError("codes", f"values must be in 0..{self.num_codes - 1}")
        if codes.numel() * self.dit.repeats > self.dit.config.max_position_embeddings:
            raise InvalidRequestError(
                "codes",
                f"{codes.numel()} codes exceed the DiT's {self.dit.config.max_position_embeddings // self.dit.repeats}",
            )
        return codes.long()

    def run(self, items: list[GenerationItem]) -> list[Any]:
        results: list[Any] = []
        for item in items:
            try:
                params = self.params(item)
                if item.inputs.get("codes") is None:  # the talker said nothing (edges.py): a reply without audio
                    results.append({})
                    continue
                codes = self.codes(item)
                speaker = self.omni.speakers[self.omni.speaker(item.inputs.get("speaker"))]
            except ValueError as e:
                results.append(e)
                continue
            results.append({"audio": self.decode(codes, speaker, params), "sample_rate": self.sample_rate})
        return results

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, speaker: dict[str, Any], params: dict[str, Any]) -> torch.Tensor:
        codes = codes.to(self.device).unsqueeze(0)
        cond = speaker["cond"].to(self.device).float().reshape(1, -1)
        ref_mel = speaker["ref_mel"].to(self.device).float().reshape(1, -1, self.dit.mel_dim)
        generator = torch.Generator(device=self.device)
        if params["seed"] is None:
            generator.seed()
        else:
            generator.manual_seed(params["seed"])
        noise = torch.randn(
            [1, codes.shape[1] * self.dit.repeats, self.dit.mel_dim],
            dtype=ref_mel.dtype,
            device=self.device,
            generator=generator,
        )
        mel = sample(
            self.dit,
            cond,
            ref_mel,
            codes,
            noise,
            params["num_steps"],
            params["guidance_scale"],
            params["sway_coefficient"],
        )
        self.calls += 1
        return self.model.code2wav_bigvgan_model(mel).reshape(-1).float()


def sample(
    dit,
    cond: torch.Tensor,
    ref_mel: torch.Tensor,
    codes: torch.Tensor,
    noise: torch.Tensor,
    num_steps: int,
    guidance_scale: float,
    sway_coefficient: float | None,
) -> torch.Tensor:
    """transformers' ``Qwen2_5OmniToken2WavDiTModel.sample`` from the initial state ``noise``; the mel [B, mel, T]."""
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import RungeKutta4ODESolver

    cond = cond.unsqueeze(1).repeat(1, noise.shape[1], 1)

    def velocity(t, x):
        if guidance_scale < 1e-5:
            return dit(
                hidden_states=x,
                speaker_embedding=cond,
                condition_vector=ref_mel,
                quantized_code=codes,
                time_step=t,
                drop_audio_conditioning=False,
                drop_code=False,
                apply_cfg=False,
            )
        out = dit(
            hidden_states=x,
            quantized_code=codes,
            speaker_embedding=cond,
            condition_vector=ref_mel,
            time_step=t,
            apply_cfg=True,
        )
        guided, null = torch.chunk(out, 2, dim=0)
        return guided + (guided - null) * guidance_scale

    t = torch.linspace(0, 1, num_steps, device=codes.device, dtype=cond.dtype)
    if sway_coefficient is not None:
        t += sway_coefficient * (torch.cos(torch.pi / 2 * t) - 1 + t)
    return RungeKutta4ODESolver(function=velocity, initial_value=noise).integrate(t)[-1].permute(0, 2, 1)
