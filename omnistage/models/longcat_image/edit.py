"""LongCat-Image-Edit: one input image, edited as ``LongCatImageEditPipeline.__call__`` does.

LongCat-Image's adapter with the edit pipeline's differences:

- the output size is the input image's aspect ratio at about 1024x1024 pixels
  (the pipeline's ``calculate_dimensions``, multiples of 16); a request's size
  may only repeat it;
- the text encoder sees the image too (resized to half the output size, through
  Qwen2.5-VL's vision tower): the prompt and the negative are each encoded alone
  with it, and their embeddings start at the vision tokens, so the text length
  (and with it the image ids' offset) depends on the output size, which is in
  the batch key;
- the input image's VAE latents (mode, no sampling) are packed and appended to
  the sequence with ids (2, L + row, L + column); only the output tokens of the
  prediction are kept;
- noise is drawn in the model dtype; no CFG renorm, no prompt rewriting.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.longcat_image.adapter import LongCatImageAdapter, LongCatJob, pos_ids
from omnistage.models.shared.latent_packing import pack
from omnistage.models.shared.ovis_adapter import TEXT

OUTPUT_AREA = 1024 * 1024  # LongCatImageEditPipeline.__call__'s target area
MAX_ASPECT = 200  # Qwen2-VL's image processor refuses more elongated images


class LongCatImageEditAdapter(LongCatImageAdapter):
    pipeline_class_name = "LongCatImageEditPipeline"
    noise_in_float32 = False

    def validate(self, job: LongCatJob) -> None:
        from diffusers.pipelines.longcat_image.pipeline_longcat_image_edit import calculate_dimensions

        p = job.params
        if len(job.images or []) != 1:
            raise InvalidRequestError(
                "multi_modal_data.image", f"LongCat-Image-Edit edits one input image, got {len(job.images or [])}"
            )
        if p.strength is not None:
            raise InvalidRequestError(
                "strength", "not used by LongCat-Image-Edit (the image conditions, it is not noised)"
            )
        self.validate_common(job)
        w, h = job.images[0].size
        if max(w, h) > MAX_ASPECT * min(w, h):
            raise InvalidRequestError(
                "multi_modal_data.image", f"a {w}x{h} image is more elongated than {MAX_ASPECT}:1"
            )
        width, height = calculate_dimensions(OUTPUT_AREA, w / h)
        for name, value in (("height", height), ("width", width)):
            asked = getattr(p, name)
            if asked is not None and asked != value:
                raise InvalidRequestError(
                    name,
                    f"LongCat-Image-Edit's output size follows the input image: "
                    f"{width}x{height} for a {w}x{h} image (leave size out or send it)",
                )
        job.height, job.width = height, width
        job.cfg_renorm, job.rewrite = False, False

    def batch_key(self, job: LongCatJob) -> Hashable:
        # the size fixes the vision tokens of the half-size prompt image, so the text length too
        return (type(self).__name__, job.height, job.width)

    # ------------------------------------------------------------- preparation

    def encode(self, jobs: list[LongCatJob]) -> None:
        processor = self.pipe.image_processor
        for j in jobs:  # as __call__ step 3: the VAE's input and the text encoder's half-size image
            image = processor.resize(j.images[0], j.height, j.width)
            j.prompt_image = processor.resize(image, j.height // 2, j.width // 2)
            j.vae_image = processor.preprocess(image, j.height, j.width)
        super().encode(jobs)

    def embed(self, prompts: list[str], jobs: list[LongCatJob]) -> dict[str, torch.Tensor]:
        # the pipeline encodes one prompt (and its image) per call
        embeds = [
            self.pipe.encode_prompt(prompt=[p], image=j.prompt_image, num_images_per_prompt=1)[0]
            for p, j in zip(prompts, jobs)
        ]
        return {TEXT: torch.cat(embeds)}

    def image_ids(self, job: LongCatJob, h: int, w: int) -> torch.Tensor:
        n = job.cond[TEXT].shape[1]
        return pos_ids(modality_id=1, type="image", start=(n, n), height=h, width=w).to(self.device)

    def init_latents(self, job: LongCatJob) -> None:
        # the input image first (VAE mode: nothing drawn from the generator), then the noise, as prepare_latents
        vae = self.pipe.vae
        dtype = job.cond[TEXT].dtype
        vae_image, job.vae_image = job.vae_image, None
        z = vae.encode(vae_image.to(device=self.device, dtype=dtype)).latent_dist.mode()
        tokens = pack(self.normalize_latents(z))
        n = job.cond[TEXT].shape[1]
        h, w = self.latent_grid(job)
        ids = pos_ids(modality_id=2, type="image", start=(n, n), height=h // 2, width=w // 2)
        ids = torch.cat([job.cond["img_ids"][0], ids.to(self.device, dtype=torch.float64)])
        for cond in (job.cond, job.uncond):
            if cond is not None:
                cond["image_latents"] = tokens.expand(job.rows, *tokens.shape[1:])
                cond["img_ids"] = ids.expand(job.rows, *ids.shape)
        job.prompt_image = None
        super().init_latents(job)

    # ------------------------------------------------------------- the batched part

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        return super().predict(torch.cat([x, cond["image_latents"]], dim=1), t, cond)[:, : x.shape[1]]
