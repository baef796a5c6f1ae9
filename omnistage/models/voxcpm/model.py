"""VoxCPM2 at inference, step-batched: the release's ``VoxCPM2Model._inference`` arithmetic over requests that
join and leave at step boundaries.

- **prompt** (``prompt.py``): text tokens and latent patches with their masks; each position's input is the
  text embedding (times ``scale_emb``) or the local encoder's embedding of its patch.
- **prefill** (one request at a time, as the release runs it): the text-semantic LM over the prompt (its
  outputs at audio positions pass the scalar quantiser), then the residual acoustic LM over the fusion of
  those outputs with the audio embeddings; both KV caches are kept per request.
- **each step, all running requests in one batch**: the local DiT samples the next patch [P, D] from the two
  LMs' last states and the previous patch (``heads.FlowSampler``, each row with its own noise and guidance);
  the stop head reads the text LM's state; the patch, through the local encoder, is the next input of both LMs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from omnistage.models.voxcpm.heads import FlowSampler, LocalEncoder, ScalarQuantizer, sub_config
from omnistage.models.voxcpm.layers import MiniCPM
from omnistage.models.voxcpm.prompt import Prompt
from omnistage.models.voxcpm.vae import AudioVAE
from omnistage.stages.ar.kv import RequestKV, StepCache


@dataclass
class VoxRow:
    """One request's state (touched only by the step thread)."""

    base_kv: RequestKV
    res_kv: RequestKV
    generator: torch.Generator | None
    temperature: float  # scales the DiT's start noise (0: no noise, deterministic)
    cfg_value: float
    timesteps: int
    min_len: int
    max_len: int
    steps: int = 0
    lm_hidden: torch.Tensor | None = None  # [H]
    res_hidden: torch.Tensor | None = None  # [H]
    cond: torch.Tensor | None = None  # the previous patch [P, D]


class Backbone(torch.nn.Module):
    """The release's module tree (its parameter names) without the audio VAE."""

    def __init__(self, cfg: dict[str, Any]):
        super().__init__()
        lm, dim, h = cfg["lm_config"], cfg["feat_dim"], cfg["lm_config"]["hidden_size"]
        self.base_lm = MiniCPM(lm)
        self.residual_lm = MiniCPM(
            sub_config(
                lm,
                num_hidden_layers=cfg.get("residual_lm_num_layers", 8),
                vocab_size=0,
                no_rope=cfg.get("residual_lm_no_rope", False),
            )
        )
        self.feat_encoder = LocalEncoder(sub_config(lm, cfg["encoder_config"]), dim)
        dit = cfg["dit_config"]
        self.feat_decoder = FlowSampler(sub_config(lm, dit), dim, dit.get("dit_mean_mode", False))
        self.fsq_layer = ScalarQuantizer(
            h, cfg.get("scalar_quantization_latent_dim", 512), cfg.get("scalar_quantization_scale", 9)
        )
        self.enc_to_lm_proj = torch.nn.Linear(cfg["encoder_config"]["hidden_dim"], h)
        self.lm_to_dit_proj = torch.nn.Linear(h, dit["hidden_dim"])
        self.res_to_dit_proj = torch.nn.Linear(h, dit["hidden_dim"])
        self.fusion_concat_proj = torch.nn.Linear(2 * h, h)
        self.stop_proj = torch.nn.Linear(h, h)
        self.stop_head = torch.nn.Linear(h, 2, bias=False)


class VoxCPMModel:
    def __init__(self, folder: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        folder = Path(folder)
        self.config = json.loads((folder / "config.json").read_text())
        self.net = Backbone(self.config)
        missing, unexpected = self.net.load_state_dict(load_file(str(folder / "model.safetensors")), strict=False)
        if missing:  # (extra keys, e.g. training-only ones, are ignored as the release's loader ignores them)
            raise ValueError(f"{folder}: model.safetensors lacks parameters the config needs: {missing[:3]}")
        self.net = self.net.to(device=device, dtype=dtype).eval()
        self.vae = AudioVAE(self.config["audio_vae_config"])
        self.vae.load_state_dict(load_file(str(folder / "audiovae.safetensors")))
        self.vae = self.vae.to(device).eval()  # float32, as the release keeps it
        self.prompt = Prompt(folder, self.vae, self.config["patch_size"])
        self.device, self.dtype = device, dtype
        lm = self.config["lm_config"]
        self.scale_emb = lm.get("scale_emb", 1.0) if lm.get("use_mup", True) else 1.0
        self.patch, self.feat_dim = self.config["patch_size"], self.config["feat_dim"]
        self.max_positions = min(lm["max_position_embeddings"], self.config.get("max_length", 8192))

    def new_row(self, generator, temperature, cfg_value, timesteps, min_len, max_len) -> VoxRow:
        n_base, n_res = len(self.net.base_lm.layers), len(self.net.residual_lm.layers)
        return VoxRow(
            RequestKV(n_base), RequestKV(n_res), generator, temperature, cfg_value, timesteps, min_len, max_len
        )

    def _embed(self, feats: torch.Tensor) -> torch.Tensor:
        """patches [B, T, P, D] -> LM inputs [B, T, H]."""
        return self.net.enc_to_lm_proj(self.net.feat_encoder(feats))

    @torch.no_grad()
    def prefill(self, row: VoxRow, tokens, feats, text_mask, audio_mask) -> None:
        net = self.net
        feats = feats.to(self.device, self.dtype)[None]
        tmask = text_mask.to(self.device, self.dtype)[None, :, None]
        amask = audio_mask.to(self.device, self.dtype)[None, :, None]
        feat_embed = self._embed(feats)
        text_embed = net.base_lm.embed_tokens(tokens.to(self.device)[None]) * self.scale_emb
        enc, kvs = net.base_lm(tmask * text_embed + amask * feat_embed, causal=True)
        self._keep(row.base_kv, kvs)
        enc = net.fsq_layer(enc) * amask + enc * tmask
        res, kvs = net.residual_lm(net.fusion_concat_proj(torch.cat((enc, amask * feat_embed), dim=-1)), causal=True)
        self._keep(row.res_kv, kvs)
        row.lm_hidden, row.res_hidden, row.cond = enc[0, -1], res[0, -1], feats[0, -1]

    @staticmethod
    def _keep(kv: RequestKV, layers: list) -> None:
        for i, (k, v) in enumerate(layers):
            kv.write(i, 0, k[0], v[0])
        kv.length = layers[0][0].shape[2]

    @torch.no_grad()
    def step(self, rows: list[VoxRow]) -> tuple[torch.Tensor, list[bool]]:
        """One patch per row: (patches [B, P, D] float32, whether each row's stop head ended it). The LMs advance
        only for rows that go on."""
        net = self.net
        lm_hidden = torch.stack([r.lm_hidden for r in rows])
        res_hidden = torch.stack([r.res_hidden for r in rows])
        mu = torch.cat((net.lm_to_dit_proj(lm_hidden), net.res_to_dit_proj(res_hidden)), dim=-1)
        patches = self._sample(rows, mu)
        stop = net.stop_head(torch.nn.functional.silu(net.stop_proj(lm_hidden))).argmax(dim=-1).tolist()
        ended = []
        for i, (r, s) in enumerate(zip(rows, stop)):
            ended.append(r.steps > r.min_len and s == 1)
            r.steps += 1
            r.cond = patches[i]
        going = [i for i, r in enumerate(rows) if not ended[i] and r.steps < r.max_len]
        if going:  # (a subset keeps the [B, D, P] layout: see _sample)
            part = patches if len(going) == len(rows) else patches.transpose(1, 2)[going].transpose(1, 2)
            self._advance([rows[i] for i in going], part)
        return patches.float(), ended

    def _sample(self, rows: list[VoxRow], mu: torch.Tensor) -> torch.Tensor:
        """The DiT's next patch of every row [B, P, D]; rows with different timestep counts run apart.

        Returned as the release holds it, a transposed view of [B, D, P]: the local encoder's first linear layer
        then reads it in the same memory order and rounds as the release does (a contiguous copy differs by
        4e-7)."""
        out = torch.empty(len(rows), self.feat_dim, self.patch, device=self.device, dtype=self.dtype)
        groups: dict[int, list[int]] = {}
        for i, r in enumerate(rows):
            groups.setdefault(r.timesteps, []).append(i)
        for steps, idx in groups.items():
            noise = torch.stack([self._noise(rows[i]) for i in idx]).to(self.device, self.dtype)
            cond = torch.stack([rows[i].cond for i in idx]).transpose(1, 2).contiguous()
            cfg = torch.tensor([rows[i].cfg_value for i in idx], device=self.device, dtype=self.dtype)
            x = self.net.feat_decoder(mu[idx], cond, noise, steps, cfg)
            out[idx] = x
        return out.transpose(1, 2)

    def _noise(self, r: VoxRow) -> torch.Tensor:
        if r.temperature == 0:
            return torch.zeros(self.feat_dim, self.patch)
        return torch.randn((1, self.feat_dim, self.patch), generator=r.generator)[0] * r.temperature

    def _advance(self, rows: list[VoxRow], patches: torch.Tensor) -> None:
        net = self.net
        embed = self._embed(patches[:, None])[:, 0]
        lm = net.fsq_layer(net.base_lm.step(embed, StepCache([r.base_kv for r in rows], 1)))
        res = net.residual_lm.step(
            net.fusion_concat_proj(torch.cat((lm, embed), dim=-1)), StepCache([r.res_kv for r in rows], 1)
        )
        for i, r in enumerate(rows):
            r.lm_hidden, r.res_hidden = lm[i], res[i]

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """latent frames [B, D, T] -> float32 audio [B, T * samples per frame]."""
        return self.vae.decode(latents.to(self.device, torch.float32)).cpu()
