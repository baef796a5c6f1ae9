"""Z-Image (Turbo) for the diffusion engine: Qwen3 text encoder -> ZImageTransformer2DModel -> AutoencoderKL.

Mirrors ``ZImagePipeline.__call__`` step by step so that one request alone
reproduces it exactly. What differs from the other flow-matching families:

- the transformer takes lists: one latent ``[C, 1, H, W]`` and one caption of
  its own (unpadded) length per row, and masks internally, so prompts of
  different token lengths (and ``max_sequence_length``) share a forward. Each
  job keeps its captions unpadded; ``collate`` pads a forward's to the longest
  with their lengths, and ``predict`` cuts them back;
- it predicts the negated velocity at ``(1000 - t) / 1000``;
- CFG runs for any ``guidance_scale`` > 0 and combines as ``c + g * (c - u)``
  in float32, optionally renormalised (``cfg_normalization``) and switched off
  late in the schedule (``cfg_truncation``), both per request.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.flow_schedule import start_schedule
from omnistage.models.shared.input_checks import refuse_images
from omnistage.models.shared.text_padding import pad_texts
from omnistage.stages.diffusion.adapter import DiffusionJob
from omnistage.stages.diffusion.blocks import BlockIO, BlockLayout
from omnistage.stages.diffusion.diffusers_adapter import DiffusersAdapter

DEFAULT_SIZE = 1024  # ZImagePipeline.__call__'s default height and width
MAX_SEQUENCE_LENGTH = 512  # its default caption length


# ZImageTransformerBlock(x, attn_mask, freqs_cis, adaln_input, noise_mask, adaln_noisy, adaln_clean) -> x, on the
# padded unified (caption + image) sequence; TeaCache compares the timestep embedding (``adaln_input``)
ZIMAGE_BLOCK = BlockIO(
    returns="x",
    hidden="x",
    per_row=("attn_mask", "freqs_cis", "adaln_input", "noise_mask", "adaln_noisy", "adaln_clean"),
)


@dataclass
class ZImageJob(DiffusionJob):
    """A request's Z-Image state, set in validate."""

    max_sequence_length: int = 0
    cfg_normalization: float = 0.0  # caps the guided prediction's norm at this multiple of the cond one (0: off)
    cfg_truncation: float = 1.0  # the fraction of the schedule after which CFG stops


class ZImageAdapter(DiffusersAdapter):
    job_class = ZImageJob
    pipeline_class_name = "ZImagePipeline"

    def __init__(self, pipe: Any, dtype: torch.dtype, device: torch.device):
        super().__init__(pipe, dtype, device)
        self.in_channels = pipe.transformer.in_channels

    # ------------------------------------------------------------- request checks

    def size_multiple(self) -> int:
        return self.pipe.vae_scale_factor * 2  # VAE factor x the transformer's 2x2 patches

    def default_size(self) -> int:
        return DEFAULT_SIZE

    def validate(self, job: ZImageJob) -> None:
        p = job.params
        refuse_images(job, "Z-Image is text-to-image only; it takes no input image")
        if p.true_cfg_scale is not None:
            raise InvalidRequestError("true_cfg_scale", "not used by Z-Image: guidance_scale > 0 runs its CFG")
        self.validate_size(job, f"VAE factor {self.pipe.vae_scale_factor} x patch size 2")
        msl = int(p.max_sequence_length or MAX_SEQUENCE_LENGTH)
        if msl < 1:
            raise InvalidRequestError("max_sequence_length", f"expected a positive integer, got {msl}")
        job.max_sequence_length = msl
        norm = p.extra_args.get("cfg_normalization", 0.0)
        trunc = p.extra_args.get("cfg_truncation", 1.0)
        for name, value in (("cfg_normalization", norm), ("cfg_truncation", trunc)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise InvalidRequestError(name, f"expected a number >= 0, got {value!r}")
        job.cfg_normalization = float(norm)
        job.cfg_truncation = float(trunc)
        job.cfg = float(p.guidance_scale) > 0  # diffusers' rule for Z-Image: any positive scale
        self.validate_rows(job)

    def batch_key(self, job: ZImageJob) -> Hashable:
        # captions of any token length share a forward: the transformer masks them
        return ("z_image", job.height, job.width)

    def latent_grid(self, job: ZImageJob) -> tuple[int, int]:
        f = self.pipe.vae_scale_factor
        return 2 * (job.height // (f * 2)), 2 * (job.width // (f * 2))

    # ------------------------------------------------------------- preparation

    def encode_texts(self, prompts: list[str], jobs: list[ZImageJob]) -> list[torch.Tensor]:
        """Each prompt's caption embedding ``[tokens, D]``, unpadded; one text-encoder call per
        ``max_sequence_length`` among ``jobs`` (it pads and truncates the tokens)."""
        out: list[torch.Tensor | None] = [None] * len(prompts)
        for msl in sorted({j.max_sequence_length for j in jobs}):
            idx = [i for i, j in enumerate(jobs) if j.max_sequence_length == msl]
            embeds, _ = self.pipe.encode_prompt(
                prompt=[prompts[i] for i in idx],
                device=self.device,
                do_classifier_free_guidance=False,
                max_sequence_length=msl,
            )
            for i, e in zip(idx, embeds):
                out[i] = e
        return out

    def encode(self, jobs: list[ZImageJob]) -> None:
        # the captions keep their own token counts: per job [rows, tokens, D]; collate pads per forward
        for j, e in zip(jobs, self.encode_texts([j.prompt for j in jobs], jobs)):
            j.cond = {"cap_feats": self.repeat_rows(e[None], j.rows)}
        cfg = [j for j in jobs if j.do_cfg]
        if cfg:
            for j, e in zip(cfg, self.encode_texts([j.negative_prompt or "" for j in cfg], cfg)):
                j.uncond = {"cap_feats": self.repeat_rows(e[None], j.rows)}

    def collate(self, conds: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Captions padded to the longest in the forward, with their lengths (kept on the host: ``predict``
        reads them without waiting for the device)."""
        padded, lengths = pad_texts([c["cap_feats"] for c in conds])
        return {"cap_feats": padded, "cap_len": torch.tensor(lengths)}

    def timesteps(self, job: ZImageJob) -> None:
        n = job.params.num_inference_steps
        h, w = self.latent_grid(job)
        sigmas = torch.linspace(1.0, 1 / n, n).tolist()  # get_default_z_image_sigmas
        state = start_schedule(self, job, n, sigmas=sigmas, mu=self.dynamic_shift_mu((h // 2) * (w // 2)))
        trunc = job.cfg_truncation
        if job.cfg and trunc <= 1:
            # no CFG (and no uncond pass) at steps past the truncation point of the schedule
            g = float(job.params.guidance_scale)
            t_norms = ((1000 - state.timesteps.float()) / 1000).tolist()
            job.step_guidance = [0.0 if tn > trunc else g for tn in t_norms]

    def init_latents(self, job: ZImageJob) -> None:
        h, w = self.latent_grid(job)
        job.latents = self.noise(job, (job.rows, self.in_channels, h, w), torch.float32)  # fp32 whatever the model

    # ------------------------------------------------------------- the batched parts

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        model = self.pipe.transformer
        feats = cond["cap_feats"]
        caps = [feats[i, :n] for i, n in enumerate(cond["cap_len"].tolist())]
        latents = list(x.to(model.dtype).unsqueeze(2).unbind(dim=0))
        out = model(latents, (1000 - t) / 1000, caps, return_dict=False)[0]
        return -torch.stack([o.float() for o in out]).squeeze(2)  # the sampler steps along minus the output

    def block_layouts(self) -> list[BlockLayout]:
        tr = self.pipe.transformer  # the main layers (the refiners run before them, for every row)
        return [BlockLayout.uniform(tr, tr.layers, ZIMAGE_BLOCK, probe=lambda block, args: args["adaln_input"])]

    def combine_guidance(self, u: torch.Tensor, c: torch.Tensor, job: ZImageJob) -> torch.Tensor:
        """``c + g * (c - u)`` per row in float32, optionally capped at ``cfg_normalization`` times the cond
        prediction's norm (ZImagePipeline's loop; exact on the negated predictions: every step is
        sign-symmetric)."""
        g, cap = job.guidance, job.cfg_normalization
        rows = []
        for pos, neg in zip(c.float(), u.float()):
            pred = pos + g * (pos - neg)
            if cap > 0:
                max_norm = torch.linalg.vector_norm(pos) * cap
                norm = torch.linalg.vector_norm(pred)
                # x * 1 is exact: where() keeps diffusers' values without a host sync on the comparison
                pred = pred * torch.where(norm > max_norm, max_norm / norm, torch.ones_like(norm))
            rows.append(pred)
        return torch.stack(rows)
