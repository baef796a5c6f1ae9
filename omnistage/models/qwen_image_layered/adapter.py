"""Qwen-Image-Layered for the diffusion engine: an RGBA image in, N RGBA layers out.

Mirrors ``QwenImageLayeredPipeline.__call__`` step by step so that one request alone reproduces it. The input
image is resized to about ``resolution``² pixels at its aspect ratio and VAE-encoded (its mode, no sampling); the
request denoises N + 1 latent frames (the composite first, then the layers) packed in 2x2 patches, with the
image's tokens after them in every forward and the transformer's layered RoPE told each frame's grid
(``img_shapes``). The composite frame is dropped after decoding: the answer is the N layers, in the pipeline's
order. What differs from Qwen-Image's own adapter:

- true CFG runs (``true_cfg_scale`` > 1 with a negative prompt) as diffusers does, in a forward of its own
  (``separate_cfg_passes``): the pipeline calls the transformer once for the prompt and once for the negative,
  each unpadded; optionally renormalised per token to the cond prediction's norm (``cfg_normalize``);
- prompts of different token lengths in one forward are padded and masked (no mask when they agree, as
  diffusers passes none for one prompt); an empty prompt is replaced by the text encoder's caption of the image.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.input_checks import refuse_params
from omnistage.models.shared.text_padding import pad_texts
from omnistage.stages.diffusion.adapter import DiffusionJob
from omnistage.stages.diffusion.diffusers_adapter import DiffusersAdapter

MAX_LAYERS = 8  # the most layers one request may ask for (each adds a latent frame of the input image's tokens)
DEFAULT_LAYERS = 4  # QwenImageLayeredPipeline.__call__'s
RESOLUTIONS = (640, 1024)  # the pixel areas (side²) the pipeline accepts
TEXT, MASK, IMAGE, SHAPES = "encoder_hidden_states", "encoder_hidden_states_mask", "image_latents", "img_shapes"


@dataclass
class LayeredJob(DiffusionJob):
    """A request's state, set in validate (the input image's latents in encode)."""

    layers: int = DEFAULT_LAYERS
    image_height: int = 0  # the resized input image (the VAE's input), before the latent grid's rounding
    image_width: int = 0
    cfg_normalize: bool = False
    use_en_prompt: bool = False
    max_sequence_length: int = 512


class QwenImageLayeredAdapter(DiffusersAdapter):
    job_class = LayeredJob
    pipeline_class_name = "QwenImageLayeredPipeline"
    input_image_mode = "RGBA"  # the layers' alpha comes from the input's
    separate_cfg_passes = True

    def validate(self, job: LayeredJob) -> None:
        p, extra = job.params, job.params.extra_args
        if not job.images or len(job.images) != 1:
            raise InvalidRequestError("multi_modal_data.image", "Qwen-Image-Layered decomposes exactly one image")
        refuse_params(
            p, ("height", "width", "strength"), "not used: the layers' size follows the image at `resolution`"
        )
        layers = extra.get("layers", DEFAULT_LAYERS)
        if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= MAX_LAYERS:
            raise InvalidRequestError("layers", f"expected an integer from 1 to {MAX_LAYERS}, got {layers!r}")
        resolution = extra.get("resolution", RESOLUTIONS[0])
        if resolution not in RESOLUTIONS:
            raise InvalidRequestError("resolution", f"expected one of {RESOLUTIONS}, got {resolution!r}")
        msl = p.max_sequence_length or 512
        if msl > 1024:
            raise InvalidRequestError("max_sequence_length", f"at most 1024, got {msl}")
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_layered import calculate_dimensions

        w, h = job.images[0].size
        job.image_width, job.image_height = calculate_dimensions(resolution * resolution, w / h)
        m = self.pipe.vae_scale_factor * 2
        job.width, job.height = job.image_width // m * m, job.image_height // m * m
        job.layers, job.max_sequence_length = layers, msl
        job.cfg_normalize, job.use_en_prompt = bool(extra.get("cfg_normalize", False)), bool(extra.get("use_en_prompt"))
        scale = p.true_cfg_scale if p.true_cfg_scale is not None else 4.0
        job.cfg, job.cfg_scale = scale > 1 and job.negative_prompt is not None, float(scale)
        job.rows = p.num_outputs_per_prompt

    def batch_key(self, job: LayeredJob) -> Hashable:
        # the latent frames and the image's tokens must agree to share a forward; prompts are padded and masked
        return ("qwen_image_layered", job.layers, job.height, job.width, job.image_height, job.image_width)

    # ------------------------------------------------------------- preparation

    def encode(self, jobs: list[LayeredJob]) -> None:
        pipe, dtype = self.pipe, self.pipe.text_encoder.dtype
        for j in jobs:
            resized = pipe.image_processor.resize(j.images[0], j.image_height, j.image_width)
            image = pipe.image_processor.preprocess(resized, j.image_height, j.image_width).unsqueeze(2)
            if j.prompt in ("", " "):  # the pipeline's rule: the text encoder captions the image
                j.prompt = pipe.get_image_caption(resized, use_en_prompt=j.use_en_prompt, device=self.device)
            z = pipe._encode_vae_image(image.to(self.device, dtype), j.generator).permute(0, 2, 1, 3, 4)
            z = pipe._pack_latents(z, 1, z.shape[2], z.shape[3], z.shape[4], 1)
            f = pipe.vae_scale_factor * 2
            shapes = torch.tensor([[j.layers, j.height // f, j.width // f, j.image_height // f, j.image_width // f]])
            side = {IMAGE: self.repeat_rows(z, j.rows), SHAPES: self.repeat_rows(shapes, j.rows)}
            j.cond = {TEXT: self.text(j.prompt, j), **side}
            if j.do_cfg:
                j.uncond = {TEXT: self.text(j.negative_prompt or "", j), **side}

    def text(self, prompt: str, job: LayeredJob) -> torch.Tensor:
        """One prompt's embedding ``[rows, tokens, D]``, unpadded (a lone prompt has no padding in diffusers)."""
        embeds, _ = self.pipe.encode_prompt(prompt, self.device, 1, max_sequence_length=job.max_sequence_length)
        return self.repeat_rows(embeds, job.rows)

    def collate(self, conds: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        texts = [c[TEXT] for c in conds]
        out = {k: torch.cat([c[k] for c in conds]) for k in (IMAGE, SHAPES)}
        padded, lengths = pad_texts(texts)
        out[TEXT] = padded
        if any(n != padded.shape[1] for n in lengths):
            positions = torch.arange(padded.shape[1])
            out[MASK] = torch.stack([(positions < n).long() for n in lengths]).to(padded.device)
        return out

    def timesteps(self, job: LayeredJob) -> None:
        n = job.params.num_inference_steps
        f = self.pipe.vae_scale_factor * 2
        image_tokens = (job.image_height // f) * (job.image_width // f)
        mu = (image_tokens / (256 * 256 / 16 / 16)) ** 0.5  # the pipeline's shift: the input image's token count
        sigmas = np.linspace(1.0, 0, n + 1)[:-1]
        state = self.sampler.make_state(n, device=self.device, sigmas=sigmas, mu=mu)
        state.scheduler.set_begin_index(0)
        job.sampler_state = state

    def init_latents(self, job: LayeredJob) -> None:
        c = self.pipe.transformer.config.in_channels // 4
        f = self.pipe.vae_scale_factor
        h, w = 2 * (job.height // (f * 2)), 2 * (job.width // (f * 2))
        noise = self.noise(job, (job.rows, job.layers + 1, c, h, w), self.pipe.text_encoder.dtype)
        job.latents = self.pipe._pack_latents(noise, job.rows, c, h, w, job.layers + 1)

    # ------------------------------------------------------------- the batched parts

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        model = self.pipe.transformer
        shapes = [
            [(1, h, w)] * (n + 1) + [(1, ih, iw)] for n, h, w, ih, iw in cond[SHAPES].tolist()
        ]  # every frame's grid, then the input image's
        out = model(
            hidden_states=torch.cat([x, cond[IMAGE]], dim=1),
            timestep=t.to(x.dtype) / 1000,
            encoder_hidden_states=cond[TEXT],
            encoder_hidden_states_mask=cond.get(MASK),
            img_shapes=shapes,
            additional_t_cond=torch.zeros(x.shape[0], dtype=torch.long, device=x.device),  # RGBA output
            return_dict=False,
        )[0]
        return out[:, : x.shape[1]]

    def combine_guidance(self, u: torch.Tensor, c: torch.Tensor, job: LayeredJob) -> torch.Tensor:
        comb = u + job.guidance * (c - u)  # the pipeline's order of operations
        if not job.cfg_normalize:
            return comb
        return comb * (torch.norm(c, dim=-1, keepdim=True) / torch.norm(comb, dim=-1, keepdim=True))

    def decode(self, jobs: list[LayeredJob]) -> list[list[Any]]:
        return [self.decode_one(j) for j in jobs]  # layer counts and sizes differ between jobs

    def decode_one(self, job: LayeredJob) -> list[np.ndarray]:
        """The job's layers as uint8 HxWx4 arrays: for each output row, its layers in the pipeline's order."""
        vae = self.pipe.vae
        x = self.pipe._unpack_latents(job.latents, job.height, job.width, job.layers, self.pipe.vae_scale_factor)
        x = x.to(vae.dtype)
        mean, std = self.channel_stats(x)
        x = (x / (1.0 / std) + mean)[:, :, 1:]  # as the pipeline divides; the first frame (the composite) is no layer
        b, c, f, h, w = x.shape
        images = vae.decode(x.permute(0, 2, 1, 3, 4).reshape(-1, c, 1, h, w), return_dict=False)[0].squeeze(2)
        arr = (self.pipe.image_processor.postprocess(images, output_type="np") * 255).round().astype("uint8")
        return [np.ascontiguousarray(a) for a in arr]
