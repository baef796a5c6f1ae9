"""Qwen-Image-2.1 (Qwen3-VL -> QwenImage21Transformer2DModel -> AutoencoderKLQwenImage21) for the diffusion
engine, text-to-image and edits with condition images (``/v1/images/edits``).

Mirrors ``QwenImage21Pipeline.__call__`` step by step so that one request alone reproduces it:

- the Qwen3-VL encoder's last hidden states before its final norm, the system turn dropped, each prompt at its
  own unpadded length (encoded alone, as diffusers encodes one prompt);
- RoPE places the target image after the text (its frame index is the text length) and the transformer reads
  one layout for the whole batch, so padding would move it: the batch key fixes the output size and the
  layout of the prompt (and of the negative when the request runs CFG): its length and where its image slots
  are, laid out by the pipeline's processor in validate;
- latents are 64-channel tokens at the VAE's 16x grid (``[rows, h*w, C]``), drawn as ``[rows, 1, C, h, w]``
  from the request's generator; the transformer folds 2x2 of them per slot itself (``img_mask``: the text
  positions, then the target image's slots);
- true CFG: ``true_cfg_scale`` > 1 with a negative prompt (diffusers' ``do_true_cfg``), as a second forward
  (its text differs in length), combined ``u + s * (c - u)``;
- condition images (one or more): each resized to ``output_resolution`` squared pixels at its aspect ratio
  (sides multiples of 32) and seen twice, by the text encoder with the prompt (its vision tokens take image
  slots in the sequence) and by the VAE (mode, normalised), whose tokens fill those slots; the output size
  defaults to the last image's aspect ratio;
- the schedule is the pipeline's ``sample_sigmas`` when the folder declares them, else linspace(1, 1/n),
  dynamically shifted for the target's token count;
- the transformer's prefix KV cache (``use_kv_cache``) is not used: a shared forward holds rows at different
  steps, so every step recomputes the text keys and values. The text tokens are block-causal and modulated at
  t = 0, so this is the same function: in fp32 the engine equals diffusers' default (cached) call exactly on
  the tiny fixture (the harness row and tests/models/qwen_image_21).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.flow_schedule import start_schedule
from omnistage.stages.diffusion.adapter import DiffusionJob
from omnistage.stages.diffusion.blocks import BlockIO, BlockLayout
from omnistage.stages.diffusion.diffusers_adapter import DiffusersAdapter

TEXT = "encoder_hidden_states"
GRID = "latent_grid"  # (h, w) per latent grid of a row: the condition images', then the target's (img_shapes)
SLOTS = "img_mask"  # per row: which text-encoder positions are image slots (condition images' and the target's)
IMAGES = "image_latents"  # per row: the condition images' packed VAE latents, in order
DEFAULT_TRUE_CFG = 1.0  # QwenImage21Pipeline.__call__'s default: no CFG unless asked for
DEFAULT_SIZE = 1024  # __call__'s output_resolution
MAX_IMAGES = 4  # condition images per request (each costs its area again in the sequence)


def fit(area: int, ratio: float) -> tuple[int, int]:
    """(width, height) of ``area`` pixels at ``ratio``, sides rounded to 32 (the pipeline's calculate_dimensions)."""
    width = math.sqrt(area * ratio)
    return round(width / 32) * 32, round(width / ratio / 32) * 32


@dataclass
class QwenImage21Job(DiffusionJob):
    """A request's Qwen-Image-2.1 state, set in validate."""

    resolution: int = DEFAULT_SIZE  # output_resolution: the side of the square area images are fitted to
    conditions: list[tuple[Any, int, int]] = field(default_factory=list)  # condition images, with (width, height)
    layouts: tuple[Any, Any] | None = None  # the prompt's layout, and the negative's when the request runs CFG


class QwenImage21Adapter(DiffusersAdapter):
    pipeline_class_name = "QwenImage21Pipeline"
    separate_cfg_passes = True  # cond and uncond text differ in length, and diffusers runs them apart
    job_class = QwenImage21Job

    def __init__(self, pipe: Any, dtype: torch.dtype, device: torch.device):
        super().__init__(pipe, dtype, device)
        self.latent_channels = pipe.transformer.config.in_channels

    # ------------------------------------------------------------- request checks

    def size_multiple(self) -> int:
        return self.pipe.vae_scale_factor * 2  # VAE factor x the transformer's 2x2 slots

    def validate(self, job: QwenImage21Job) -> None:
        p = job.params
        resolution = job.params.extra_args.get("output_resolution", DEFAULT_SIZE)
        if isinstance(resolution, bool) or not isinstance(resolution, int) or not 32 <= resolution <= 4096:
            raise InvalidRequestError("output_resolution", f"expected an integer in 32..4096, got {resolution!r}")
        job.resolution = resolution
        if p.strength is not None:
            raise InvalidRequestError("strength", "not used by Qwen-Image-2.1 (no image-to-image)")
        if p.max_sequence_length is not None:
            raise InvalidRequestError(
                "max_sequence_length", "Qwen-Image-2.1 encodes the whole prompt (no limit to set)"
            )
        scale = p.true_cfg_scale if p.true_cfg_scale is not None else DEFAULT_TRUE_CFG
        job.conditions = self.condition_images(job) if job.images else []
        self.check_size(job)
        job.cfg = scale > 1 and job.negative_prompt is not None  # diffusers' do_true_cfg (stage_params warns)
        job.cfg_scale = scale
        job.rows = p.num_outputs_per_prompt
        negative = self.layout(job.negative_prompt, job) if job.cfg else None
        job.layouts = (self.layout(job.prompt, job), negative)

    def check_size(self, job: QwenImage21Job) -> None:
        """The output size: the request's (a multiple of 32), else the last condition image's aspect ratio at
        ``output_resolution``, else ``output_resolution`` square (floored to 32, as __call__ floors)."""
        m, res = self.size_multiple(), job.resolution
        if job.images:
            image = job.images[-1]
            width, height = fit(res * res, image.size[0] / image.size[1])
        else:
            width = height = res // m * m
        for name, default in (("height", height), ("width", width)):
            value = getattr(job.params, name) or default
            if value % m or value <= 0:
                raise InvalidRequestError(
                    name,
                    f"{value} is not a positive multiple of {m} (VAE factor {self.pipe.vae_scale_factor} x 2x2 slots)",
                )
            setattr(job, name, int(value))

    def condition_images(self, job: QwenImage21Job) -> list[tuple[Any, int, int]]:
        """Each condition image as the pipeline prepares it (RGBA), with its fitted size (width, height)."""
        if len(job.images) > MAX_IMAGES:
            raise InvalidRequestError(
                "multi_modal_data.image", f"{len(job.images)} condition images; at most {MAX_IMAGES}"
            )
        area = job.resolution**2
        out = []
        for image in job.images:
            image = image if image.mode == "RGBA" else image.convert("RGBA")
            w, h = fit(area, image.size[0] / image.size[1])
            if not (w and h):
                raise InvalidRequestError(
                    "multi_modal_data.image",
                    f"a {image.size[0]}x{image.size[1]} image fits no size at this output_resolution",
                )
            out.append((image, w, h))
        return out

    def layout(self, prompt: str, job: QwenImage21Job) -> tuple[bool, ...]:
        """Which embedding positions are image slots, as ``_get_qwen_prompt_embeds`` lays the prompt out (the
        system turn dropped); its length is the text's. RoPE puts the target after it, so it is the batch key."""
        pipe = self.pipe
        images = [self.encoder_image(im, w, h) for im, w, h in job.conditions]
        ids = pipe.processor(text=[self.template(prompt, len(images))], images=images or None)["input_ids"][0]
        return tuple(int(i) == pipe._img_token_id for i in ids[pipe._drop_idx :])

    def template(self, prompt: str, n_images: int) -> str:
        """The pipeline's chat template with ``n_images`` image placeholders; "" is encoded as " ", as diffusers."""
        pipe = self.pipe
        if not n_images:
            return pipe.prompt_template_t2i.format(prompt or " ")
        slot = "<image1><|vision_start|><|image_pad|><|vision_end|>"
        slots = slot + "".join(
            f" <image{i}><|vision_start|><|image_pad|><|vision_end|>" for i in range(2, n_images + 1)
        )
        return pipe.prompt_template_ti2i.replace(slot, slots).format(prompt or " ")

    def encoder_image(self, image: Any, width: int, height: int) -> Any:
        """The text encoder's copy: resized, RGBA composited on white (``_get_qwen_prompt_embeds``)."""
        from PIL import Image

        image = self.pipe.image_processor.resize(image, width=width, height=height)
        if image.mode == "RGBA":
            white = Image.new("RGB", image.size, (255, 255, 255))
            white.paste(image, mask=image.getchannel("A"))
            image = white
        return image

    def batch_key(self, job: QwenImage21Job) -> Hashable:
        # one RoPE layout per forward (img_shapes and img_mask of the first row): the output size, the condition
        # images' sizes and the prompt's (and the negative's) slot layout fixed
        sizes = tuple((w, h) for _, w, h in job.conditions)
        return ("qwen_image_21", job.height, job.width, sizes, job.layouts)

    def latent_grid(self, job: QwenImage21Job) -> tuple[int, int]:
        f = self.pipe.vae_scale_factor
        return 2 * (job.height // (f * 2)), 2 * (job.width // (f * 2))

    # ------------------------------------------------------------- prompt encoding

    def embed_one(self, prompt: str, job: QwenImage21Job) -> dict[str, torch.Tensor]:
        """One prompt (with the request's condition images) alone: no padding, so no mask (as diffusers)."""
        pipe, f = self.pipe, self.pipe.vae_scale_factor
        images = [self.encoder_image(im, w, h) for im, w, h in job.conditions] or None
        embeds, _, slots = pipe._get_qwen_prompt_embeds(prompt, images, self.device)
        grids = [(h // f, w // f) for _, w, h in job.conditions] + [(job.height // f, job.width // f)]
        target = grids[-1][0] * grids[-1][1] // 4  # the target image's slots (append_target_slots)
        slots = torch.cat([slots, slots.new_ones(1, target)], dim=1)
        grid = torch.tensor([grids], dtype=torch.long, device=self.device)  # [1, images + 1, 2]
        return {k: self.repeat_rows(v, job.rows) for k, v in ((TEXT, embeds), (SLOTS, slots), (GRID, grid))}

    def encode(self, jobs: list[QwenImage21Job]) -> None:
        for j in jobs:
            j.cond = self.embed_one(j.prompt, j)
            if j.do_cfg:
                j.uncond = self.embed_one(j.negative_prompt, j)

    # ------------------------------------------------------------- schedule and latents

    def timesteps(self, job: QwenImage21Job) -> None:
        n = job.params.num_inference_steps
        sigmas = self.pipe.config.get("sample_sigmas")
        if sigmas is None:
            sigmas = np.linspace(1.0, 1 / n, n)
        else:  # the folder's own grid; its length is the step count, as in __call__
            n = len(sigmas)
        h, w = self.latent_grid(job)
        start_schedule(self, job, n, sigmas=sigmas, mu=self.dynamic_shift_mu(h * w))

    def init_latents(self, job: QwenImage21Job) -> None:
        h, w = self.latent_grid(job)
        noise = self.noise(job, (job.rows, 1, self.latent_channels, h, w), job.cond[TEXT].dtype)
        job.latents = noise.view(job.rows, self.latent_channels, h * w).transpose(1, 2)  # _pack_latents
        if job.conditions:  # here, not in encode: an image the VAE cannot take fails only its own request
            tokens = self.image_tokens(job)
            for cond in (job.cond, job.uncond):
                if cond is not None:
                    cond[IMAGES] = tokens

    def image_tokens(self, job: QwenImage21Job) -> torch.Tensor:
        """The condition images' packed VAE latents (mode, normalised), repeated to the job's rows."""
        vae, processor = self.pipe.vae, self.pipe.image_processor
        packed = []
        for image, w, h in job.conditions:
            pixels = processor.preprocess(image, width=w, height=h).unsqueeze(2).to(self.device, vae.dtype)
            z = vae.encode(pixels).latent_dist.mode()
            mean, std = self.channel_stats(z)
            z = (z - mean) / std
            packed.append(z.view(1, self.latent_channels, -1).transpose(1, 2))
        return self.repeat_rows(torch.cat(packed, dim=1), job.rows)

    # ------------------------------------------------------------- the batched part

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        tr = self.pipe.transformer
        shapes = [(1, int(h), int(w)) for h, w in cond[GRID][0]]
        hidden = torch.cat([cond[IMAGES], x], dim=1) if IMAGES in cond else x  # condition images first
        out = tr(
            hidden_states=hidden,
            timestep=t.to(x.dtype) / 1000,
            encoder_hidden_states=cond[TEXT],
            img_shapes=[shapes] * x.shape[0],
            img_mask=cond[SLOTS],
            return_dict=False,
        )[0]
        return out[:, -x.shape[1] :]

    def block_layouts(self) -> list[BlockLayout]:
        """One stream of joint tokens (text, condition images, target) through every block; the shared
        ``modulation`` has a row per batch row, plus (``causal_condition``) a trailing t = 0 row that the text
        and condition tokens of every row read, kept when the rows are cut. The text tokens are block-causal at
        t = 0, so their residual does not change between steps: caching the whole stream's is exact for them."""
        tr = self.pipe.transformer
        keep_t0 = {"modulation": keep_t0_row} if tr.config.causal_condition else {}
        io = BlockIO(returns="hidden_states", per_row=("modulation", "key_valid", "attention_mask"), slicers=keep_t0)
        return [BlockLayout.uniform(tr, tr.transformer_blocks, io, probe=lambda block, a: a["modulation"])]

    def decode(self, jobs: list[QwenImage21Job]) -> list[list[np.ndarray]]:
        vae = self.pipe.vae
        h, w = self.latent_grid(jobs[0])
        x = torch.cat([j.latents for j in jobs])
        x = x.transpose(1, 2).reshape(x.shape[0], self.latent_channels, 1, h, w).to(vae.dtype)  # _unpack_latents
        mean, std = self.channel_stats(x)
        return self.to_uint8(vae.decode(x * std + mean, return_dict=False)[0][:, :, 0], jobs)


def keep_t0_row(modulation: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """The rows ``idx`` of a ``causal_condition`` modulation and its trailing t = 0 row."""
    return torch.cat([modulation.index_select(0, idx), modulation[-1:]])
