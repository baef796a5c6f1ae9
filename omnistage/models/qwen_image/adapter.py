"""Qwen-Image (text-to-image, -2512), Qwen-Image-Edit (one input image) and Qwen-Image-Edit-2509/-2511
(1-3 input images) for the diffusion engine.

Mirrors ``QwenImagePipeline.__call__``, ``QwenImageEditPipeline.__call__`` and
``QwenImageEditPlusPipeline.__call__`` step by step so that one request alone
reproduces them exactly:

- the Qwen2.5-VL text encoder's last hidden states with the template's prefix
  dropped; each request keeps its own unpadded length (text-to-image cuts it at
  ``max_sequence_length``), and rows of different lengths share a forward padded
  with zeros and masked, as diffusers pads a batch of prompts (``collate``);
- latents are 2x2-packed patches ``[rows, (h/2)*(w/2), 4C]`` drawn from the
  request's generator; the timestep goes in as t/1000;
- true CFG: ``true_cfg_scale`` > 1 with a negative prompt, as a second forward
  (diffusers runs cond and uncond as separate passes), combined norm-preserving:
  ``(u + s * (c - u)) * |c| / |u + s * (c - u)|`` per token (``combine_guidance``);
  ``guidance_scale`` is ignored, as diffusers ignores it for these (not
  guidance-distilled) transformers;
- edits: the input images go through the text encoder's vision tower with the
  prompt (resized to ~384x384 px each for -2509/-2511, to the output-sized
  ~1024x1024 px image for Qwen-Image-Edit) and, resized to ~1024x1024 px, through
  the VAE (mode, no sampling); their packed latents are appended to the sequence
  and only the output tokens of the prediction are kept;
- RoPE reads ``img_shapes[0]`` for the whole batch, so the batch key fixes the
  output size and every input image's resized size.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.flow_schedule import start_schedule
from omnistage.models.shared.input_checks import refuse_images
from omnistage.stages.diffusion.adapter import DiffusionJob
from omnistage.stages.diffusion.blocks import BlockIO, BlockLayout
from omnistage.stages.diffusion.diffusers_adapter import DiffusersAdapter

TEXT = "encoder_hidden_states"
MASK = "encoder_hidden_states_mask"
DEFAULT_TRUE_CFG = 4.0  # the pipelines' __call__ default
MAX_SEQUENCE_LENGTH = 512  # QwenImagePipeline.__call__'s default
TEXT_LIMIT = 1024  # check_inputs refuses longer
EDIT_AREA = 1024 * 1024  # QwenImageEditPipeline.__call__: the input image (and default output) area


def _doubled_rows(temb: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """zero_cond_t (-2511): ``temb`` holds every row's embedding, then every row's t = 0 embedding."""
    return torch.cat([temb.index_select(0, idx), temb.index_select(0, idx + temb.shape[0] // 2)])


# QwenImageTransformerBlock(hidden_states, encoder_hidden_states, encoder_hidden_states_mask, temb,
# image_rotary_emb, joint_attention_kwargs, modulate_index) -> (encoder_hidden_states, hidden_states)
QWEN_BLOCK = BlockIO(
    returns=("encoder_hidden_states", "hidden_states"), per_row=("encoder_hidden_states_mask", "temb", "modulate_index")
)
QWEN_BLOCK_ZERO_COND_T = BlockIO(
    returns=QWEN_BLOCK.returns, per_row=QWEN_BLOCK.per_row, slicers={"temb": _doubled_rows}
)


@dataclass
class QwenImageJob(DiffusionJob):
    """A request's Qwen-Image state, set in validate (the sizes by the edit adapters)."""

    max_sequence_length: int = 0
    vae_sizes: list[tuple[int, int]] = field(default_factory=list)  # (height, width) of each input image, VAE
    condition_sizes: list[tuple[int, int]] = field(default_factory=list)  # ... and for the vision tower
    default_size: tuple[int, int] | None = None  # the output (height, width) when the request sets none


class QwenImageAdapter(DiffusersAdapter):
    job_class = QwenImageJob
    pipeline_class_name = "QwenImagePipeline"
    separate_cfg_passes = True  # cond and uncond text differ in length, and diffusers runs them apart
    max_images: ClassVar[int] = 0

    def __init__(self, pipe: Any, dtype: torch.dtype, device: torch.device):
        super().__init__(pipe, dtype, device)
        cfg = pipe.transformer.config
        if cfg.guidance_embeds:
            # diffusers' QwenImage pipelines cannot run one either (the time embedding takes no guidance)
            raise ValueError("guidance-distilled Qwen-Image transformers (guidance_embeds=true) are not supported")
        self.latent_channels = cfg.in_channels // 4

    # ------------------------------------------------------------- request checks

    def size_multiple(self) -> int:
        return self.pipe.vae_scale_factor * 2  # VAE factor x the 2x2 packing

    def validate(self, job: QwenImageJob) -> None:
        refuse_images(job, "this Qwen-Image checkpoint is text-to-image only; edits need a Qwen-Image-Edit checkpoint")
        self.validate_common(job)
        self.validate_size(job, f"VAE factor {self.pipe.vae_scale_factor} x 2x2 packing")
        job.max_sequence_length = self.max_sequence_length(job)

    def validate_common(self, job: QwenImageJob) -> None:
        p = job.params
        if p.strength is not None:
            raise InvalidRequestError(
                "strength", "not used by Qwen-Image (input images condition the edit, they are not noised)"
            )
        msl = self.max_sequence_length(job)
        if msl > TEXT_LIMIT:
            raise InvalidRequestError("max_sequence_length", f"{msl} exceeds Qwen-Image's limit of {TEXT_LIMIT}")
        if p.num_inference_steps == 1 and self.pipe.scheduler.config.get("shift_terminal"):
            # the stretch to the terminal sigma divides by zero for a one-sigma table (diffusers returns NaN)
            raise InvalidRequestError(
                "num_inference_steps",
                "1 step makes a NaN image here (the scheduler's "
                f"shift_terminal={self.pipe.scheduler.config.shift_terminal} stretch has no 1-step schedule); "
                "send num_inference_steps 2 or more (a warm-up: 2)",
            )
        scale = p.true_cfg_scale if p.true_cfg_scale is not None else DEFAULT_TRUE_CFG
        # diffusers' do_true_cfg: a scale without a negative prompt runs without (params.stage_params warns)
        job.cfg = scale > 1 and job.negative_prompt is not None
        job.cfg_scale = scale
        job.rows = p.num_outputs_per_prompt

    @staticmethod
    def max_sequence_length(job: QwenImageJob) -> int:
        p = job.params
        return int(p.max_sequence_length or MAX_SEQUENCE_LENGTH)

    def batch_key(self, job: QwenImageJob) -> Hashable:
        # RoPE uses the first row's image shapes for the whole batch; text lengths may differ (masked)
        return ("qwen_image", job.height, job.width)

    def latent_grid(self, height: int, width: int) -> tuple[int, int]:
        f = self.pipe.vae_scale_factor
        return 2 * (height // (f * 2)), 2 * (width // (f * 2))

    # ------------------------------------------------------------- prompt encoding

    def encode(self, jobs: list[QwenImageJob]) -> None:
        for j, text in zip(jobs, self.embed_texts([j.prompt for j in jobs], jobs)):
            j.cond = {TEXT: self.repeat_rows(text, j.rows)}
        cfg = [j for j in jobs if j.do_cfg]
        if cfg:
            for j, text in zip(cfg, self.embed_texts([j.negative_prompt for j in cfg], cfg)):
                j.uncond = {TEXT: self.repeat_rows(text, j.rows)}
        for j in jobs:
            shapes = self.img_shapes(j)
            for cond in (j.cond, j.uncond):
                if cond is not None:
                    cond["img_shapes"] = shapes.expand(j.rows, *shapes.shape)

    def embed_texts(self, prompts: list[str], jobs: list[QwenImageJob]) -> list[torch.Tensor]:
        """One batched text-encoder call; per prompt its own ``[1, length, dim]`` embeddings (diffusers pads a
        batch and masks; here each request keeps its unpadded rows, cut at its ``max_sequence_length``)."""
        embeds, mask = self.pipe.encode_prompt(
            prompt=prompts, device=self.device, num_images_per_prompt=1, max_sequence_length=TEXT_LIMIT
        )
        lengths = [embeds.shape[1]] * len(prompts) if mask is None else mask.sum(dim=1).tolist()
        return [embeds[i : i + 1, : min(n, j.max_sequence_length)] for i, (n, j) in enumerate(zip(lengths, jobs))]

    def img_shapes(self, job: QwenImageJob) -> torch.Tensor:
        """The (frames, rows, columns) of every token grid in the sequence: the output, then input images."""
        h, w = self.latent_grid(job.height, job.width)
        grids = [(1, h // 2, w // 2)] + [
            (1, ih // 2, iw // 2) for ih, iw in (self.latent_grid(*s) for s in job.vae_sizes)
        ]
        return torch.tensor(grids, dtype=torch.long)

    def collate(self, conds: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Text of different lengths padded with zeros and masked, as ``encode_prompt`` pads a batch; no mask
        when every row has the same length (diffusers passes none for a lone prompt either)."""
        out = super().collate([{k: v for k, v in c.items() if k != TEXT} for c in conds])
        texts = [c[TEXT] for c in conds]
        longest = max(t.shape[1] for t in texts)
        if all(t.shape[1] == longest for t in texts):
            out[TEXT] = torch.cat(texts)
            return out
        out[TEXT] = torch.cat(
            [torch.cat([t, t.new_zeros(t.shape[0], longest - t.shape[1], t.shape[2])], dim=1) for t in texts]
        )
        positions = torch.arange(longest, device=texts[0].device)
        out[MASK] = torch.cat([(positions < t.shape[1]).expand(t.shape[0], longest) for t in texts])
        return out

    # ------------------------------------------------------------- schedule and latents

    def timesteps(self, job: QwenImageJob) -> None:
        n = job.params.num_inference_steps
        h, w = self.latent_grid(job.height, job.width)
        start_schedule(self, job, n, sigmas=np.linspace(1.0, 1 / n, n), mu=self.dynamic_shift_mu((h // 2) * (w // 2)))

    def init_latents(self, job: QwenImageJob) -> None:
        h, w = self.latent_grid(job.height, job.width)
        dtype = job.cond[TEXT].dtype
        noise = self.noise(job, (job.rows, 1, self.latent_channels, h, w), dtype)
        job.latents = self.pipe._pack_latents(noise, job.rows, self.latent_channels, h, w)

    # ------------------------------------------------------------- the batched part

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        n = x.shape[1]
        hidden = torch.cat([x, cond["image_latents"]], dim=1) if "image_latents" in cond else x
        shapes = [tuple(s) for s in cond["img_shapes"][0].tolist()]
        out = self.pipe.transformer(
            hidden_states=hidden,
            timestep=t.to(x.dtype) / 1000,
            guidance=None,
            encoder_hidden_states_mask=cond.get(MASK),
            encoder_hidden_states=cond[TEXT],
            img_shapes=[shapes] * x.shape[0],
            attention_kwargs={},
            return_dict=False,
        )[0]
        return out[:, :n] if out.shape[1] != n else out

    def block_layouts(self) -> list[BlockLayout]:
        tr = self.pipe.transformer  # TeaCache compares the timestep embedding (the blocks' ``temb``)
        io = QWEN_BLOCK_ZERO_COND_T if tr.config.zero_cond_t else QWEN_BLOCK
        return [BlockLayout.uniform(tr, tr.transformer_blocks, io, probe=lambda block, args: args["temb"])]

    def combine_guidance(self, u: torch.Tensor, c: torch.Tensor, job: QwenImageJob) -> torch.Tensor:
        """diffusers' norm-preserving true CFG: the combination rescaled to the cond prediction's norm per token."""
        comb = u + job.guidance * (c - u)
        return comb * (torch.norm(c, dim=-1, keepdim=True) / torch.norm(comb, dim=-1, keepdim=True))

    def decode(self, jobs: list[QwenImageJob]) -> list[list[np.ndarray]]:
        job = jobs[0]  # one batch key per decode: one output size
        vae = self.pipe.vae
        latents = self.pipe._unpack_latents(
            torch.cat([j.latents for j in jobs]), job.height, job.width, self.pipe.vae_scale_factor
        ).to(vae.dtype)
        mean, std = self.channel_stats(latents)
        latents = latents / (1.0 / std) + mean  # diffusers divides by 1/std
        return self.to_uint8(vae.decode(latents, return_dict=False)[0][:, :, 0], jobs)


class QwenImageEditAdapter(QwenImageAdapter):
    """Qwen-Image-Edit: one input image, resized to ~1024x1024 px for both the vision tower and the VAE."""

    pipeline_class_name = "QwenImageEditPipeline"
    max_images = 1

    def validate(self, job: QwenImageJob) -> None:
        if not job.images:
            raise InvalidRequestError(
                "multi_modal_data.image", "Qwen-Image-Edit needs an input image (POST /v1/images/edits)"
            )
        if len(job.images) > self.max_images:
            raise InvalidRequestError(
                "multi_modal_data.image",
                f"{len(job.images)} input images; this checkpoint takes at most {self.max_images}",
            )
        self.validate_common(job)
        self.image_sizes(job)
        # the default output size is the (last) input image's ~1024x1024 px size; an explicit one must divide
        h, w = job.default_size
        m = self.size_multiple()
        for name, default in (("height", h), ("width", w)):
            value = getattr(job.params, name) or default
            if value % m:
                raise InvalidRequestError(
                    name, f"{value} is not divisible by {m} (VAE factor {self.pipe.vae_scale_factor} x 2x2 packing)"
                )
            setattr(job, name, int(value))

    def image_sizes(self, job: QwenImageJob) -> None:
        """(height, width) of each input image for the VAE and for the vision tower, as __call__ resizes them."""
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import calculate_dimensions

        w, h = calculate_dimensions(EDIT_AREA, job.images[0].width / job.images[0].height)
        job.vae_sizes, job.condition_sizes, job.default_size = [(h, w)], [(h, w)], (h, w)

    def batch_key(self, job: QwenImageJob) -> Hashable:
        # the input images' tokens join the sequence and RoPE reads the first row's grids: all sizes must match
        return (type(self).__name__, job.height, job.width, tuple(job.vae_sizes))

    def condition_images(self, job: QwenImageJob) -> Any:
        """What the vision tower sees with the prompt (Qwen-Image-Edit: the resized image itself)."""
        ((h, w),) = job.condition_sizes
        return self.pipe.image_processor.resize(job.images[0], h, w)

    def vae_images(self, job: QwenImageJob) -> list[torch.Tensor]:
        ((h, w),) = job.vae_sizes
        image = self.pipe.image_processor.resize(job.images[0], h, w)
        return [self.pipe.image_processor.preprocess(image, h, w).unsqueeze(2)]

    def embed_texts(self, prompts: list[str], jobs: list[QwenImageJob]) -> list[torch.Tensor]:
        # per request: each prompt is encoded with its own input images (diffusers' edit pipelines take one prompt)
        out = []
        for prompt, job in zip(prompts, jobs):
            embeds, mask = self.pipe.encode_prompt(
                prompt=[prompt], image=self.condition_images(job), device=self.device, num_images_per_prompt=1
            )
            out.append(embeds if mask is None else embeds[:, : int(mask.sum())])
        return out

    def init_latents(self, job: QwenImageJob) -> None:
        super().init_latents(job)
        # here, not in encode: an image the VAE cannot take fails only its own request
        dtype = job.cond[TEXT].dtype
        packed = []
        for image in self.vae_images(job):
            z = self.pipe._encode_vae_image(image.to(device=self.device, dtype=dtype), generator=job.generator)
            if job.rows > 1:
                z = torch.cat([z] * job.rows, dim=0)
            packed.append(self.pipe._pack_latents(z, job.rows, self.latent_channels, z.shape[3], z.shape[4]))
        tokens = torch.cat(packed, dim=1)
        for cond in (job.cond, job.uncond):
            if cond is not None:
                cond["image_latents"] = tokens


class QwenImageEditPlusAdapter(QwenImageEditAdapter):
    """Qwen-Image-Edit-2509 / -2511: 1-3 input images, "Picture i:" in the prompt, each at ~384x384 px for the
    vision tower and ~1024x1024 px for the VAE."""

    pipeline_class_name = "QwenImageEditPlusPipeline"
    max_images = 3  # the model card's supported range

    def image_sizes(self, job: QwenImageJob) -> None:
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import (
            CONDITION_IMAGE_SIZE,
            VAE_IMAGE_SIZE,
            calculate_dimensions,
        )

        vae_sizes, condition_sizes = [], []
        for image in job.images:
            ratio = image.width / image.height
            cw, ch = calculate_dimensions(CONDITION_IMAGE_SIZE, ratio)
            vw, vh = calculate_dimensions(VAE_IMAGE_SIZE, ratio)
            condition_sizes.append((ch, cw))
            vae_sizes.append((vh, vw))
        last = job.images[-1]
        w, h = calculate_dimensions(EDIT_AREA, last.width / last.height)
        job.vae_sizes, job.condition_sizes, job.default_size = vae_sizes, condition_sizes, (h, w)

    def condition_images(self, job: QwenImageJob) -> Any:
        return [self.pipe.image_processor.resize(im, h, w) for im, (h, w) in zip(job.images, job.condition_sizes)]

    def vae_images(self, job: QwenImageJob) -> list[torch.Tensor]:
        return [
            self.pipe.image_processor.preprocess(im, h, w).unsqueeze(2) for im, (h, w) in zip(job.images, job.vae_sizes)
        ]


# one entry point: the folder's pipeline class picks text-to-image or edit
QwenImageAdapter.variants = {
    "QwenImageEditPipeline": QwenImageEditAdapter,
    "QwenImageEditPlusPipeline": QwenImageEditPlusAdapter,
}
