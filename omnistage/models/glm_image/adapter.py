"""GLM-Image's diffusion half (GlmImageTransformer2DModel + VAE) for the diffusion engine.

Mirrors ``GlmImagePipeline.__call__`` given ``prior_token_ids`` step by step,
so one request alone reproduces it exactly. The AR model is not loaded here:
its tokens arrive in the stage inputs from the edge processor
(``edges.ar_tokens_to_prior``):

- ``prior_token_ids``: the target grid's AR token ids (one per 32x32 px, row major);
- ``prior_grid``: ``[token_h, token_w]`` of that grid;
- image-to-image only: ``prior_token_image_ids`` (every source image's AR ids,
  concatenated), ``source_image_grid_thw`` (``[[1, h, w], ...]`` per image) and
  the source images themselves (``multi_modal_data.image``, each h*32 x w*32 px).

The conditional and unconditional passes cannot share a forward (the glyph
embedding of the prompt and of "" differ in length and the transformer takes
no text mask), hence ``separate_cfg_passes``. Requests batch when resolution
and glyph length match.

Image-to-image follows diffusers' KV-cache scheme: each source image is VAE
encoded and run through the transformer once ("write"); every cond pass then
attends to those cached keys/values ("read"), the uncond pass does not
("skip"). The cache lives in ``job.cond["source_kv"]`` as one tensor per row,
so the engine's row batching concatenates it like any other conditioning;
``predict`` rebuilds a ``GlmImageKVCache`` from it for each forward.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from omnistage.errors import InvalidRequestError
from omnistage.models.glm_image.grid import AR_FACTOR
from omnistage.stages.diffusion.adapter import DiffusionJob
from omnistage.stages.diffusion.blocks import BlockIO, BlockLayout
from omnistage.stages.diffusion.diffusers_adapter import DiffusersAdapter

MAX_SEQUENCE_LENGTH = 2048  # diffusers' default for the glyph encoder


def upsample_prior(ids: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """AR ids on their h x w grid (one per 32 px) -> [1, 4hw] ids on the 2h x 2w latent-patch grid (nearest x2):
    the "upsampled prior tokens" ``GlmImagePipeline.__call__`` takes as ``prior_token_ids``. Diffusers' own
    helper for it is private (``_upsample_token_ids``); tests check this against it."""
    return ids.view(h, w).repeat_interleave(2, dim=0).repeat_interleave(2, dim=1).reshape(1, -1)


@dataclass
class GlmImageJob(DiffusionJob):
    """A request's GLM-Image state, set in validate."""

    max_sequence_length: int = 0
    prior: torch.Tensor | None = None  # the AR stage's prior tokens, upsampled to the latent grid
    glyph_len: int = 0  # tokens of the quoted text the glyph encoder reads
    source: list[tuple[Any, torch.Tensor]] | None = None  # edit inputs: each image with its prior token ids


class GlmImageAdapter(DiffusersAdapter):
    job_class = GlmImageJob
    pipeline_class_name = "GlmImagePipeline"
    separate_cfg_passes = True

    skip_components = ("vision_language_encoder", "processor")  # the AR model is stage 0's

    def size_multiple(self) -> int:
        return AR_FACTOR

    # ------------------------------------------------------------- request checks

    def validate(self, job: GlmImageJob) -> None:
        p = job.params
        if job.negative_prompt:
            raise InvalidRequestError(
                "negative_prompt", 'GLM-Image does not take a negative prompt (its uncond pass uses "")'
            )
        ids, grid = job.inputs.get("prior_token_ids"), job.inputs.get("prior_grid")
        if ids is None or grid is None:
            raise InvalidRequestError(
                "prior_token_ids",
                "the GLM-Image diffusion stage needs the AR stage's prior tokens (prior_token_ids and prior_grid)",
            )
        if not isinstance(grid, (list, tuple)) or len(grid) != 2 or not all(isinstance(g, int) and g > 0 for g in grid):
            raise InvalidRequestError("prior_grid", f"expected [token_h, token_w] positive integers, got {grid!r}")
        th, tw = grid
        ids = torch.as_tensor(ids, dtype=torch.long).flatten()
        if ids.numel() != th * tw:
            raise InvalidRequestError("prior_token_ids", f"{ids.numel()} ids do not fill the {th}x{tw} prior grid")
        codebook = self.pipe.transformer.config.prior_vq_quantizer_codebook_size
        if ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < codebook):
            raise InvalidRequestError("prior_token_ids", f"ids must lie in 0..{codebook - 1}")
        for name, grid_px in (("height", th * AR_FACTOR), ("width", tw * AR_FACTOR)):
            given = getattr(p, name)
            if given is not None and given != grid_px:
                raise InvalidRequestError(name, f"{given} differs from the AR stage's prior grid ({grid_px} px)")
            setattr(job, name, grid_px)
        msl = p.max_sequence_length or MAX_SEQUENCE_LENGTH
        job.max_sequence_length = msl
        job.prior = upsample_prior(ids, th, tw).to(self.device)
        job.glyph_len = self._glyph_len(job.prompt, msl)
        job.source = self._validate_sources(job)
        job.rows = p.num_outputs_per_prompt

    def _validate_sources(self, job: GlmImageJob) -> list[tuple[Any, torch.Tensor]] | None:
        """Image-to-image inputs -> [(source image, its upsampled prior ids)], or None for text-to-image."""
        ids, grids, images = (
            job.inputs.get("prior_token_image_ids"),
            job.inputs.get("source_image_grid_thw"),
            job.images,
        )
        if ids is None and grids is None and not images:
            return None
        if not images:
            raise InvalidRequestError(
                "multi_modal_data.image",
                "prior_token_image_ids/source_image_grid_thw are given but the request has no source image",
            )
        for name, value in (("prior_token_image_ids", ids), ("source_image_grid_thw", grids)):
            if value is None:
                raise InvalidRequestError(
                    name,
                    "image-to-image needs the AR stage's source-image tokens "
                    "(prior_token_image_ids and source_image_grid_thw)",
                )
        if job.params.strength is not None:
            raise InvalidRequestError(
                "strength",
                "GLM-Image image-to-image does not take a strength (the source image "
                "conditions through the attention cache, it is not noised)",
            )
        if not isinstance(grids, (list, tuple)) or not all(
            isinstance(g, (list, tuple))
            and len(g) == 3
            and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in g)
            and g[0] == 1
            for g in grids
        ):
            raise InvalidRequestError(
                "source_image_grid_thw", f"expected [[1, h, w], ...] positive integers, got {grids!r}"
            )
        if len(grids) != len(images):
            raise InvalidRequestError(
                "source_image_grid_thw",
                f"{len(grids)} grids for {len(images)} source images (multi_modal_data.image); one grid per image",
            )
        try:
            ids = torch.as_tensor(ids)
        except (TypeError, ValueError, RuntimeError):
            ids = None
        if ids is None or ids.dtype in (torch.bool, torch.uint8) or ids.is_floating_point() or ids.is_complex():
            raise InvalidRequestError("prior_token_image_ids", "expected a list of integer token ids")
        ids = ids.to(torch.long).flatten()
        sizes = [h * w for _, h, w in grids]
        if ids.numel() != sum(sizes):
            raise InvalidRequestError(
                "prior_token_image_ids", f"{ids.numel()} ids do not fill source_image_grid_thw ({sum(sizes)} tokens)"
            )
        codebook = self.pipe.transformer.config.prior_vq_quantizer_codebook_size
        if not (0 <= int(ids.min()) and int(ids.max()) < codebook):
            raise InvalidRequestError("prior_token_image_ids", f"ids must lie in 0..{codebook - 1}")
        sources = []
        for i, (image, (_, h, w), part) in enumerate(zip(images, grids, torch.split(ids, sizes))):
            if image.size != (w * AR_FACTOR, h * AR_FACTOR):
                raise InvalidRequestError(
                    f"multi_modal_data.image[{i}]",
                    f"is {image.size[0]}x{image.size[1]} px, but "
                    f"source_image_grid_thw[{i}] = [1, {h}, {w}] means {w * AR_FACTOR}x{h * AR_FACTOR}",
                )
            # diffusers upsamples each source image's ids on its own grid, then flattens them
            sources.append((image, upsample_prior(part, h, w).view(-1).to(self.device)))
        return sources

    def _source_len(self, job: GlmImageJob) -> int | None:
        """Length of the cached source sequence (latent patches of all source images), None for text-to-image."""
        if not job.source:
            return None
        f, patch = self.pipe.vae_scale_factor, self.pipe.transformer.config.patch_size
        return sum((im.size[1] // f // patch) * (im.size[0] // f // patch) for im, _ in job.source)

    def _glyph_len(self, prompt: str, msl: int) -> int:
        """Length of ``encode_prompt``'s glyph embeddings for this prompt (each glyph text padded to even length)."""
        texts = self.pipe.get_glyph_texts(prompt)[0] or [""]
        ids = self.pipe.tokenizer(texts, max_length=msl, truncation=True).input_ids
        return sum(len(i) + (len(i) + 1) % 2 for i in ids)

    def batch_key(self, job: GlmImageJob) -> Hashable:
        # no text mask in the transformer: glyph length and latent size must match inside a batch;
        # image-to-image rows carry a cached source sequence, which must have one length per batch
        return ("glm_image", job.height, job.width, job.glyph_len, self._source_len(job))

    # ------------------------------------------------------------- preparation

    def _glyph_embeds(self, prompt: str, msl: int) -> torch.Tensor:
        """One prompt's glyph embeddings, as ``__call__`` computes them (no CFG: the uncond pass encodes "")."""
        return self.pipe.encode_prompt(
            [prompt], do_classifier_free_guidance=False, device=self.device, dtype=self.dtype, max_sequence_length=msl
        )[0]

    def encode(self, jobs: list[GlmImageJob]) -> None:
        empty = None
        for j in jobs:
            msl = j.max_sequence_length
            # diffusers encodes each prompt on its own (one glyph-encoder call per prompt)
            embeds = self._glyph_embeds(j.prompt, msl)
            dtype = embeds.dtype
            size = torch.tensor([[j.height, j.width]], dtype=dtype, device=self.device)
            common = {
                "prior_token_id": self.repeat_rows(j.prior, j.rows),
                "target_size": self.repeat_rows(size, j.rows),
                "crop_coords": torch.zeros((j.rows, 2), dtype=dtype, device=self.device),
            }
            drop = torch.zeros_like(common["prior_token_id"], dtype=torch.bool)
            j.cond = {"encoder_hidden_states": self.repeat_rows(embeds, j.rows), "prior_token_drop": drop, **common}
            if j.do_cfg:
                if empty is None or empty[0] != msl:
                    empty = (msl, self._glyph_embeds("", msl))
                j.uncond = {
                    "encoder_hidden_states": self.repeat_rows(empty[1], j.rows),
                    "prior_token_drop": torch.ones_like(drop),
                    **common,
                }

    def timesteps(self, job: GlmImageJob) -> None:
        from diffusers.pipelines.glm_image.pipeline_glm_image import calculate_shift

        cfg = self.pipe.scheduler.config
        steps = job.params.num_inference_steps
        f, patch = self.pipe.vae_scale_factor, self.pipe.transformer.config.patch_size
        seq_len = ((job.height // f) * (job.width // f)) // patch**2
        # the pipeline's own table: integer timesteps from num_train_timesteps down, sigmas = t / T
        timesteps = np.linspace(cfg.num_train_timesteps, 1.0, steps + 1)[:-1].astype(np.int64).astype(np.float32)
        sigmas = timesteps / cfg.num_train_timesteps
        mu = calculate_shift(
            seq_len, cfg.get("base_image_seq_len", 256), cfg.get("base_shift", 0.25), cfg.get("max_shift", 0.75)
        )
        job.sampler_state = self.sampler.make_state(
            steps, 0, device=self.device, timesteps=timesteps, sigmas=sigmas, mu=mu
        )

    def init_latents(self, job: GlmImageJob) -> None:
        f = self.pipe.vae_scale_factor
        shape = (job.rows, self.pipe.transformer.config.in_channels, job.height // f, job.width // f)
        dtype = job.cond["encoder_hidden_states"].dtype
        job.latents = self.noise(job, shape, dtype)
        if job.source:
            # here rather than in encode(): a source image that fails to encode fails only its own request
            kv = self._source_kv(job, dtype)
            job.cond["source_kv"] = self.repeat_rows(kv.unsqueeze(0), job.rows)

    def _source_kv(self, job: GlmImageJob, dtype: torch.dtype) -> torch.Tensor:
        """diffusers' "write" passes for one request: [layers, 2 (k, v), S, heads, head_dim]."""
        from diffusers.models.transformers.transformer_glm_image import GlmImageKVCache

        tr, vae = self.pipe.transformer, self.pipe.vae
        multiple = self.pipe.vae_scale_factor * tr.config.patch_size
        no_text = torch.zeros_like(job.cond["encoder_hidden_states"])[:1, :0]
        cache = GlmImageKVCache(num_layers=tr.config.num_layers)
        cache.set_mode("write")
        for image, ids in job.source:
            w, h = image.size
            pixels = self.pipe.image_processor.preprocess(
                image, height=h // multiple * multiple, width=w // multiple * multiple
            )
            pixels = pixels.to(device=self.device, dtype=dtype)
            latent = self.normalize_latents(vae.encode(pixels).latent_dist.mode())  # diffusers' "argmax"
            # the arguments diffusers passes: no text, no prior drop, t = 0, the image's own size
            tr(
                hidden_states=latent,
                encoder_hidden_states=no_text,
                prior_token_id=ids,
                prior_token_drop=torch.zeros_like(ids, dtype=torch.bool),
                timestep=torch.zeros((1,), device=self.device),
                target_size=torch.tensor([pixels.shape[-2:]], device=self.device),
                crop_coords=torch.zeros((1, 2), device=self.device),
                kv_caches=cache,
            )
        # one sample per layer, several images concatenated along the sequence by store()
        return torch.stack(
            [torch.stack([cache[i].k_caches[0][0], cache[i].v_caches[0][0]]) for i in range(cache.num_layers)]
        )

    # ------------------------------------------------------------- the batched parts

    def predict(self, x: torch.Tensor, t: torch.Tensor, cond: dict[str, torch.Tensor]) -> torch.Tensor:
        tr = self.pipe.transformer
        return tr(
            hidden_states=x.to(tr.dtype),
            encoder_hidden_states=cond["encoder_hidden_states"],
            prior_token_id=cond["prior_token_id"],
            prior_token_drop=cond["prior_token_drop"],
            timestep=t - 1,  # the pipeline feeds t - 1
            target_size=cond["target_size"],
            crop_coords=cond["crop_coords"],
            return_dict=False,
            kv_caches=self._read_cache(cond.get("source_kv")),
        )[0].float()

    @staticmethod
    def _read_cache(source_kv: torch.Tensor | None) -> Any:
        """Rows' cached source keys/values -> a GlmImageKVCache in "read" mode (one sample per row).
        None (text-to-image rows, and every uncond pass: diffusers' "skip") -> no cache."""
        if source_kv is None:
            return None
        from diffusers.models.transformers.transformer_glm_image import GlmImageKVCache

        cache = GlmImageKVCache(num_layers=source_kv.shape[1])
        for row in source_kv:
            for i, (k, v) in enumerate(row):
                cache[i].store(k.unsqueeze(0), v.unsqueeze(0))
            cache.next_sample()
        cache.set_mode("read")
        return cache

    def block_layouts(self) -> list[BlockLayout]:
        tr = self.pipe.transformer
        return [BlockLayout.uniform(tr, tr.transformer_blocks, GLM_BLOCK, probe=_modulated_input)]

    def normalize_latents(self, z: torch.Tensor) -> torch.Tensor:
        mean, std = self.channel_stats(z)
        return (z - mean) / std

    def denormalize_latents(self, x: torch.Tensor) -> torch.Tensor:
        mean, std = self.channel_stats(x)
        return x * std + mean


def _kv_rows(cache: Any, idx: torch.Tensor) -> Any:
    """A layer's source KV cache ("read": one cached sample per row) cut to the rows ``idx``."""
    if cache.mode != "read" or len(cache.k_caches) <= 1:  # "skip", or one sample shared by every row
        return cache
    from diffusers.models.transformers.transformer_glm_image import GlmImageLayerKVCache

    rows = GlmImageLayerKVCache()
    rows.k_caches = [cache.k_caches[i] for i in idx.tolist()]
    rows.v_caches = [cache.v_caches[i] for i in idx.tolist()]
    rows.mode = cache.mode
    return rows


def _modulated_input(block: Any, args: Any) -> torch.Tensor:
    """TeaCache's probe: the first block's timestep-modulated image tokens."""
    return block.norm1(args["hidden_states"], args["encoder_hidden_states"], args["temb"])[0]


# GlmImageTransformerBlock(hidden_states, encoder_hidden_states, temb, image_rotary_emb, attention_mask,
# attention_kwargs, kv_cache) -> (hidden_states, encoder_hidden_states)
GLM_BLOCK = BlockIO(
    returns=("hidden_states", "encoder_hidden_states"), per_row=("temb", "kv_cache"), slicers={"kv_cache": _kv_rows}
)
