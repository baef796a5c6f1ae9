"""HunyuanVideo-1.5 text- and image-to-video (Qwen2.5-VL + ByT5 glyph text, 3-D DiT, causal video VAE) for the
diffusion engine.

Mirrors ``HunyuanVideo15Pipeline.__call__`` (and ``HunyuanVideo15ImageToVideoPipeline.__call__``) so that one
request alone reproduces it exactly: latents in the transformer's dtype from the request's generator, the DiT's
input the latents with the condition latents and their frame mask concatenated on channels (zeros for
text-to-video), cond and uncond as separate forwards (the folder's guider runs them one after the other), and
the guider's own CFG rule at the request's ``guidance_scale`` (the folder's guider scale by default). Prompts are
padded to the pipeline's fixed lengths (1000 Qwen tokens, 256 ByT5 bytes) and masked, so any prompts share a
forward.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.shared.input_checks import refuse_images
from omnistage.models.shared.video_frames import check_one_video
from omnistage.stages.diffusion.adapter import DiffusionJob, check_first_frame, frames_of_form
from omnistage.stages.diffusion.diffusers_adapter import DiffusersAdapter

# HunyuanVideo15Pipeline.__call__'s own defaults (tests check they still agree)
DEFAULT_NUM_FRAMES = 121
DEFAULT_STEPS = 50
DEFAULT_FPS = 24  # what the HunyuanVideo-1.5 releases export at


@dataclass
class HunyuanVideo15Job(DiffusionJob):
    """A request's HunyuanVideo-1.5 state, set in validate."""

    num_frames: int = 0


class HunyuanVideo15Adapter(DiffusersAdapter):
    job_class = HunyuanVideo15Job
    pipeline_class_name = "HunyuanVideo15Pipeline"
    separate_cfg_passes = True  # diffusers' guider runs cond and uncond as two forwards
    image_to_video: ClassVar[bool] = False

    def __init__(self, pipe: Any, dtype: torch.dtype, device: torch.device):
        super().__init__(pipe, dtype, device)
        from diffusers.guiders import ClassifierFreeGuidance

        guider = pipe.guider
        if type(guider) is not ClassifierFreeGuidance or (guider._start, guider._stop) != (0.0, 1.0):
            raise ValueError(
                f"{type(guider).__name__} (start {guider._start}, stop {guider._stop}): only a "
                "ClassifierFreeGuidance guider over every step is supported"
            )
        if pipe.transformer.config.get("use_meanflow", False):
            raise ValueError("a meanflow (step-distilled) HunyuanVideo-1.5 transformer is not supported yet")
        self.model_dtype = pipe.transformer.dtype
        self.patch = (pipe.transformer.config.patch_size_t, pipe.transformer.config.patch_size)

    # ------------------------------------------------------------- request checks

    def validate(self, job: HunyuanVideo15Job) -> None:
        refuse_images(
            job, "this is a text-to-video model; it takes no input image (serve a HunyuanVideo15ImageToVideoPipeline)"
        )
        p = job.params
        if (p.height is None) != (p.width is None):
            raise InvalidRequestError(
                "height" if p.height is None else "width",
                "give both height and width (or neither, for the model's default 16:9 size)",
            )
        if p.height is None:
            job.height, job.width = self.pipe.video_processor.calculate_default_height_width(
                self.pipe.default_aspect_ratio[1], self.pipe.default_aspect_ratio[0], self.pipe.target_size
            )
        else:
            job.height, job.width = int(p.height), int(p.width)
        self.validate_video(job)

    def validate_video(self, job: HunyuanVideo15Job) -> None:
        p, pipe = job.params, self.pipe
        m = pipe.vae_scale_factor_spatial * self.patch[1]
        for name in ("height", "width"):
            if getattr(job, name) % m:
                raise InvalidRequestError(
                    name,
                    f"{getattr(job, name)} is not divisible by {m} "
                    f"(VAE factor {pipe.vae_scale_factor_spatial} x patch {self.patch[1]})",
                )
        ft = pipe.vae_scale_factor_temporal
        # as asked, as HunyuanVideo15Pipeline takes it: its VAE decodes (n - 1) // ft * ft + 1 frames
        frames = frames_of_form(job, p.num_frames or DEFAULT_NUM_FRAMES, ft)
        check_one_video(p)
        for name in ("guidance_scale_2", "true_cfg_scale", "max_sequence_length"):
            if getattr(p, name) is not None:
                raise InvalidRequestError(
                    name,
                    "not used by HunyuanVideo-1.5 (its prompts have fixed padded lengths)"
                    if name == "max_sequence_length"
                    else "not used by HunyuanVideo-1.5",
                )
        job.num_frames = frames
        guider = pipe.guider
        # the folder's guider scale unless the request sets one
        g = float(p.guidance_scale) if "guidance_scale" in p.model_fields_set else float(guider.guidance_scale)
        job.cfg_scale = g
        off = 0.0 if guider.use_original_formulation else 1.0  # the guider skips CFG at this scale
        job.cfg = not np.isclose(g, off, rtol=1e-9, atol=0.0)
        job.rows = 1

    def batch_key(self, job: HunyuanVideo15Job) -> Hashable:
        return ("hunyuan_video15", job.height, job.width, self.latent_frames(job))

    def latent_frames(self, job: HunyuanVideo15Job) -> int:
        return (job.num_frames - 1) // self.pipe.vae_scale_factor_temporal + 1

    # ------------------------------------------------------------- preparation

    def embed(self, prompts: list[str], jobs: list[HunyuanVideo15Job]) -> dict[str, torch.Tensor]:
        e, m, e2, m2 = self.pipe.encode_prompt(
            prompt=prompts, device=self.device, dtype=self.model_dtype, batch_size=len(prompts)
        )
        return {
            "encoder_hidden_states": e,
            "encoder_attention_mask": m,
            "encoder_hidden_states_2": e2,
            "encoder_attention_mask_2": m2,
        }

    def embed_negatives(self, jobs: list[HunyuanVideo15Job]) -> dict[str, torch.Tensor]:
        # diffusers passes the request's negative_prompt as it is; encode_prompt turns None into ""
        return self.embed([j.negative_prompt or "" for j in jobs], jobs)

    def timesteps(self, job: HunyuanVideo15Job) -> None:
        n = job.params.num_inference_steps
        job.sampler_state = self.sampler.make_state(n, device=self.device, sigmas=np.linspace(1.0, 0.0, n + 1)[:-1])

    def init_latents(self, job: HunyuanVideo15Job) -> None:
        latents = self.pipe.prepare_latents(
            1,
            self.pipe.num_channels_latents,
            job.height,
            job.width,
            job.num_frames,
            self.model_dtype,
            self.device,
            job.generator,
        )
        job.latents = latents
        self.add_condition(job, latents)

    def add_condition(self, job: HunyuanVideo15Job, latents: torch.Tensor) -> None:
        cond, mask = self.pipe.prepare_cond_latents_and_mask(latents, self.model_dtype, self.device)
        image_embeds = torch.zeros(
            1,
            self.pipe.vision_num_semantic_tokens,
            self.pipe.vision_states_dim,
            dtype=self.model_dtype,
            device=self.device,
        )
        self.set_condition(job, torch.cat([cond, mask], dim=1), image_embeds)

    @staticmethod
    def set_condition(job: HunyuanVideo15Job, condition: torch.Tensor, image_embeds: torch.Tensor) -> None:
        for c in (job.cond, job.uncond):
            if c is not None:
                c["condition"], c["image_embeds"] = condition, image_embeds

    # ------------------------------------------------------------- the batched parts

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden = torch.cat([x, cond["condition"]], dim=1)
        return self.pipe.transformer(
            hidden_states=hidden,
            image_embeds=cond["image_embeds"],
            timestep=t.to(hidden.dtype),
            encoder_hidden_states=cond["encoder_hidden_states"],
            encoder_attention_mask=cond["encoder_attention_mask"],
            encoder_hidden_states_2=cond["encoder_hidden_states_2"],
            encoder_attention_mask_2=cond["encoder_attention_mask_2"],
            return_dict=False,
        )[0]

    def combine_guidance(self, u: torch.Tensor | None, c: torch.Tensor, job: HunyuanVideo15Job) -> torch.Tensor:
        from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import rescale_noise_cfg

        guider = self.pipe.guider  # its rule (ClassifierFreeGuidance.forward), at the request's scale
        pred = (c if guider.use_original_formulation else u) + job.guidance * (c - u)
        if guider.guidance_rescale > 0.0:
            pred = rescale_noise_cfg(pred, c, guider.guidance_rescale)
        return pred

    def denoisers(self) -> list[torch.nn.Module]:
        return [self.pipe.transformer]

    # ------------------------------------------------------------- output

    def decode(self, jobs: list[HunyuanVideo15Job]) -> list[list[np.ndarray]]:
        # one VAE call per video: AutoencoderKLHunyuanVideo15's mid-block attention builds its causal mask as
        # [B, L, L], which SDPA broadcasts against [B, 1, L, D] heads, so a decode of B > 1 latents fails
        vae, out = self.pipe.vae, []
        for j in jobs:
            video = vae.decode(j.latents.to(vae.dtype) / vae.config.scaling_factor, return_dict=False)[0]
            frames = self.pipe.video_processor.postprocess_video(video, output_type="np")  # [1, T, H, W, 3] in [0, 1]
            out.append([np.ascontiguousarray((frames[0] * 255).round().astype(np.uint8))])  # diffusers' PIL rounding
        return out

    def pack_output(self, job: HunyuanVideo15Job, decoded: list[np.ndarray]) -> dict[str, Any]:
        return {"video": decoded[0], "fps": job.params.fps or DEFAULT_FPS}


# Image-to-video (HunyuanVideo15ImageToVideoPipeline): the input image sets the size (the model's target area at
# the image's aspect ratio, centre-cropped), its VAE latents are the first frame of the condition (mask 1 there),
# and its SigLIP tokens are the DiT's image tokens.
class HunyuanVideo15I2VAdapter(HunyuanVideo15Adapter):
    pipeline_class_name = "HunyuanVideo15ImageToVideoPipeline"

    def validate(self, job: HunyuanVideo15Job) -> None:
        check_first_frame(job)
        for name in ("height", "width", "strength"):
            if getattr(job.params, name) is not None:
                raise InvalidRequestError(name, "not used by image-to-video (the input image sets the size)")
        image = job.images[0]
        job.height, job.width = self.pipe.video_processor.calculate_default_height_width(
            height=image.size[1], width=image.size[0], target_size=self.pipe.target_size
        )
        self.validate_video(job)

    def add_condition(self, job: HunyuanVideo15Job, latents: torch.Tensor) -> None:
        pipe = self.pipe
        image = pipe.video_processor.resize(job.images[0], height=job.height, width=job.width, resize_mode="crop")
        image_embeds = pipe.encode_image(image=image, batch_size=1, device=self.device, dtype=self.model_dtype)
        cond, mask = pipe.prepare_cond_latents_and_mask(
            latents=latents,
            image=image,
            batch_size=1,
            height=job.height,
            width=job.width,
            dtype=self.model_dtype,
            device=self.device,
        )
        self.set_condition(job, torch.cat([cond, mask], dim=1), image_embeds)


HunyuanVideo15Adapter.variants = {"HunyuanVideo15ImageToVideoPipeline": HunyuanVideo15I2VAdapter}
