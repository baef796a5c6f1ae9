"""The image-family table the shared harness runs (tests/models/test_image_families.py for the engine,
tests/e2e/test_image_families_http.py over HTTP).

A family joins with one ``ImageFamily`` row: its tiny fixture, diffusers' pipeline class (the reference),
a small size, the solo cases that must equal diffusers' ``__call__`` (max abs diff ``solo_tol``, 0 in fp32),
3-4 concurrent requests with different prompts / steps / guidance (each within 1e-5 of its solo result,
relative where the latents exceed 1),
and one ``images.generate`` request whose PNGs must be within one uint8 level of diffusers' images. Each
family's own special cases (edits, defaults, batch keys, bad input) stay in its own test module.

Requests are written with omnistage's parameter names; ``Req`` translates them for diffusers' ``__call__``
(``num_outputs_per_prompt`` -> ``num_images_per_prompt``, ``seed`` -> a generator, ``extra_args`` flattened)
and for the HTTP body (``extra_args`` flattened into ``extra_body``, as clients send them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class Req:
    prompt: str
    params: dict[str, Any]  # omnistage names; ``seed`` required
    negative_prompt: str | None = None
    id: str = ""

    @property
    def n(self) -> int:
        return int(self.params.get("num_outputs_per_prompt", 1))

    def engine_prompt(self) -> str | dict[str, Any]:
        if self.negative_prompt is None:
            return self.prompt
        return {"prompt": self.prompt, "negative_prompt": self.negative_prompt}

    def _extra(self, fam: ImageFamily) -> dict[str, Any]:
        return {**fam.extra, **self.params.get("extra_args", {})}

    def engine_params(self, fam: ImageFamily, **more: Any) -> dict[str, Any]:
        return {**fam.size, **self.params, "extra_args": self._extra(fam), **more}

    def diffusers_kwargs(self, fam: ImageFamily, **more: Any) -> dict[str, Any]:
        p = {k: v for k, v in self.params.items() if k not in ("seed", "num_outputs_per_prompt", "extra_args")}
        kw = {
            **fam.size,
            **p,
            **self._extra(fam),
            "num_images_per_prompt": self.n,
            "generator": torch.Generator().manual_seed(self.params["seed"]),
            **more,
        }
        if self.negative_prompt is not None:
            kw["negative_prompt"] = self.negative_prompt
        return kw

    def http_body(self, fam: ImageFamily) -> dict[str, Any]:
        """``images.generate`` keyword arguments: size string, n, and extra_body (extra_args flattened)."""
        p = {k: v for k, v in self.params.items() if k not in ("num_outputs_per_prompt", "extra_args")}
        rest = {k: v for k, v in fam.size.items() if k not in ("height", "width")}
        body = {**rest, **p, **self._extra(fam)}
        if self.negative_prompt is not None:
            body["negative_prompt"] = self.negative_prompt
        return {"size": f"{fam.size['width']}x{fam.size['height']}", "n": self.n, "extra_body": body}


@dataclass(frozen=True)
class ImageFamily:
    name: str  # the tiny fixture's name and the pipeline the folder resolves to
    diffusers_class: str  # the reference pipeline
    size: dict[str, Any]  # knobs every request of the row shares (height, width, e.g. max_sequence_length)
    solo: tuple[Req, ...]
    concurrent: tuple[Req, ...]
    http: Req
    solo_tol: float = 0.0  # > 0 only where diffusers' own order of operations differs (said in the row)
    extra: dict[str, Any] = field(default_factory=dict)  # extra_body knobs every request of the row sends
    # deploy fields for the engine harness (beyond returning latents too)
    deploy: dict[str, Any] = field(default_factory=dict)
    # where diffusers' output_type="latent" is not the denoiser's latents (FLUX.2 [klein] returns them unpacked
    # and de-normalised): (reference pipeline, the engine's latents, height, width) -> diffusers' form, by
    # diffusers' own helpers
    latent_view: Callable[[Any, torch.Tensor, int, int], torch.Tensor] | None = None

    def __str__(self) -> str:
        return self.name


def flux2_unpacked(pipe: Any, tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Flux2KleinPipeline's latent output from packed tokens: its own unpack, batch-norm and unpatchify steps."""
    f = pipe.vae_scale_factor * 2
    h, w = height // f, width // f
    x = pipe._unpack_latents_with_ids(tokens, pipe._prepare_latent_ids(torch.zeros(tokens.shape[0], 1, h, w)), h, w)
    bn, eps = pipe.vae.bn, pipe.vae.config.batch_norm_eps
    x = x * torch.sqrt(bn.running_var.view(1, -1, 1, 1) + eps) + bn.running_mean.view(1, -1, 1, 1)
    return pipe._unpatchify_latents(x)


FAMILIES: list[ImageFamily] = [
    ImageFamily(
        name="sd3",
        diffusers_class="StableDiffusion3Pipeline",
        size=dict(height=32, width=48),
        solo=(
            Req("a red cat on a chair", dict(num_inference_steps=4, guidance_scale=7.0, seed=11), id="cfg"),
            Req(
                "a red cat on a chair",
                dict(num_inference_steps=3, guidance_scale=4.0, seed=5, num_outputs_per_prompt=2),
                negative_prompt="blurry",
                id="negative-two-outputs",
            ),
        ),
        concurrent=(
            Req("a red cat", dict(num_inference_steps=8, guidance_scale=7.0, seed=1)),
            Req("green square", dict(num_inference_steps=6, guidance_scale=1.0, seed=2)),
            Req(
                "mountains at sunset",
                dict(num_inference_steps=5, guidance_scale=3.0, seed=3, num_outputs_per_prompt=2),
                negative_prompt="dark",
            ),
        ),
        http=Req(
            "a red cat",
            dict(num_inference_steps=2, guidance_scale=5.0, seed=3, num_outputs_per_prompt=2),
            negative_prompt="blurry",
        ),
    ),
    ImageFamily(
        # 32x48 pixels -> a 4x6 latent -> 2x3 packed tokens; a short T5 length keeps the forwards cheap
        name="flux",
        diffusers_class="FluxPipeline",
        size=dict(height=32, width=48, max_sequence_length=32),
        solo=(
            Req(
                "a red cat on a chair",
                dict(num_inference_steps=4, guidance_scale=3.5, seed=11),
                id="guidance-embedding",
            ),
            Req(
                "a red cat on a chair",
                dict(num_inference_steps=4, guidance_scale=5.0, true_cfg_scale=4.0, seed=11),
                negative_prompt="blurry",
                id="true-cfg",
            ),
            Req(
                "a red cat on a chair",
                dict(num_inference_steps=4, guidance_scale=2.0, seed=11, num_outputs_per_prompt=2),
                id="two-outputs",
            ),
        ),
        # different prompts, seeds, step counts, guidance embeddings and true-CFG scales (with and without)
        concurrent=(
            Req("a red cat", dict(num_inference_steps=9, seed=1, guidance_scale=3.5)),
            Req(
                "green square",
                dict(num_inference_steps=7, seed=2, guidance_scale=2.0, true_cfg_scale=4.0),
                negative_prompt="blurry",
            ),
            Req(
                "a watercolor painting of mountains at sunset",
                dict(num_inference_steps=5, seed=3, guidance_scale=6.0, num_outputs_per_prompt=2),
            ),
            Req(
                "city skyline",
                dict(num_inference_steps=6, seed=4, guidance_scale=1.0, true_cfg_scale=2.5),
                negative_prompt="dark",
            ),
        ),
        http=Req(
            "a red cat",
            dict(num_inference_steps=3, true_cfg_scale=2.5, seed=3, num_outputs_per_prompt=2),
            negative_prompt="blurry",
        ),
    ),
    ImageFamily(
        name="qwen_image",
        diffusers_class="QwenImagePipeline",
        size=dict(height=32, width=48),
        solo=(
            Req(
                "a red cat sitting on a blue chair",
                dict(num_inference_steps=3, true_cfg_scale=3.0, seed=11),
                negative_prompt="blurry, low quality",
                id="true-cfg",
            ),  # other text lengths
            # the default scale (4.0) without a negative prompt: no CFG, as diffusers
            Req("a red cat sitting on a blue chair", dict(num_inference_steps=3, seed=11), id="no-negative"),
            # the default scale with a negative: CFG
            Req(
                "a red cat sitting on a blue chair",
                dict(num_inference_steps=3, seed=11, num_outputs_per_prompt=2),
                negative_prompt=" ",
                id="two-outputs",
            ),
        ),
        # different prompts (text lengths, padded and masked in one forward), seeds, steps, true-CFG scales
        concurrent=(
            Req("a red cat", dict(num_inference_steps=9, seed=1)),
            Req(
                "green square and yellow circle",
                dict(num_inference_steps=7, seed=2, true_cfg_scale=4.0),
                negative_prompt="blurry",
            ),
            Req(
                "a watercolor painting of mountains at sunset",
                dict(num_inference_steps=5, seed=3, num_outputs_per_prompt=2),
            ),
            Req(
                "city skyline",
                dict(num_inference_steps=6, seed=4, true_cfg_scale=2.5),
                negative_prompt="dark, low quality, jpeg artifacts",
            ),
        ),
        http=Req(
            "a red cat on a blue chair",
            dict(num_inference_steps=3, true_cfg_scale=3.0, seed=3, num_outputs_per_prompt=2),
            negative_prompt="blurry",
        ),
    ),
    ImageFamily(
        name="z_image",
        diffusers_class="ZImagePipeline",
        size=dict(height=32, width=48),  # 2x3 image tokens
        solo=(
            Req("a red cat on a chair", dict(num_inference_steps=4, guidance_scale=0.0, seed=11), id="turbo"),
            # CFG runs for any positive scale (not only > 1)
            Req("a red cat on a chair", dict(num_inference_steps=4, guidance_scale=0.5, seed=11), id="small-cfg"),
            Req(
                "a red cat on a chair",
                dict(num_inference_steps=4, guidance_scale=4.0, seed=11, num_outputs_per_prompt=2),
                negative_prompt="blurry",
                id="cfg-two-outputs",
            ),
            Req(
                "a red cat on a chair",
                dict(
                    num_inference_steps=4,
                    guidance_scale=3.0,
                    seed=11,
                    extra_args=dict(cfg_normalization=0.5, cfg_truncation=0.5),
                ),
                id="normalized-truncated",
            ),
        ),  # the cap bites
        # prompts of different token lengths (masked), caption limits, CFG scales incl. none and truncated
        concurrent=(
            Req("a red cat", dict(num_inference_steps=9, seed=1, guidance_scale=0.0)),
            Req(
                "a watercolor painting of mountains at sunset, high detail",
                dict(num_inference_steps=7, seed=2, guidance_scale=4.0),
                negative_prompt="blurry",
            ),
            Req(
                "green square",
                dict(
                    num_inference_steps=5, seed=3, guidance_scale=2.0, num_outputs_per_prompt=2, max_sequence_length=24
                ),
            ),
            Req(
                "city skyline at night with neon lights",
                dict(
                    num_inference_steps=6,
                    seed=4,
                    guidance_scale=3.0,
                    extra_args=dict(cfg_normalization=1.2, cfg_truncation=0.6),
                ),
            ),
        ),
        http=Req(
            "a red cat",
            dict(
                num_inference_steps=4,
                guidance_scale=2.5,
                seed=3,
                num_outputs_per_prompt=2,
                extra_args=dict(cfg_normalization=1.5),
            ),
            negative_prompt="blurry",
        ),
    ),
    ImageFamily(
        # binning off: the requested size itself (binning: tests/models/pixart_sigma); 2x3 patches of 2x2 latents
        name="pixart_sigma",
        diffusers_class="PixArtSigmaPipeline",
        size=dict(height=32, width=48),
        extra=dict(use_resolution_binning=False),
        solo=(
            Req("a red cat on a chair", dict(num_inference_steps=4, guidance_scale=4.5, seed=11), id="cfg"),
            Req("a red cat on a chair", dict(num_inference_steps=3, guidance_scale=1.0, seed=11), id="no-cfg"),
            Req(
                "a red cat on a chair",
                dict(num_inference_steps=3, guidance_scale=3.0, seed=5, num_outputs_per_prompt=2),
                negative_prompt="blurry",
                id="negative-two-outputs",
            ),
        ),
        # different prompts (masked text), steps (multistep solver state per request), CFG on and off
        concurrent=(
            Req("a red cat", dict(num_inference_steps=8, guidance_scale=4.5, seed=1)),
            Req("green square and yellow circle", dict(num_inference_steps=6, guidance_scale=1.0, seed=2)),
            Req(
                "mountains at sunset",
                dict(num_inference_steps=5, guidance_scale=2.0, seed=3, num_outputs_per_prompt=2),
                negative_prompt="dark",
            ),
            Req("city skyline", dict(num_inference_steps=7, guidance_scale=7.0, seed=4, max_sequence_length=300)),
        ),
        http=Req(
            "a red cat",
            dict(num_inference_steps=3, guidance_scale=4.0, seed=3, num_outputs_per_prompt=2),
            negative_prompt="blurry",
        ),
    ),
    ImageFamily(
        # DC-AE factor 32: 64x96 pixels are a 2x3 latent; binning off (binning: tests/models/sana)
        name="sana",
        diffusers_class="SanaPipeline",
        size=dict(height=64, width=96),
        extra=dict(use_resolution_binning=False),
        solo=(
            Req("a red cat on a chair", dict(num_inference_steps=4, guidance_scale=4.5, seed=11), id="cfg"),
            Req("a red cat on a chair", dict(num_inference_steps=3, guidance_scale=1.0, seed=11), id="no-cfg"),
            Req(
                "a red cat on a chair",
                dict(num_inference_steps=3, guidance_scale=3.0, seed=5, num_outputs_per_prompt=2),
                negative_prompt="blurry",
                id="negative-two-outputs",
            ),
        ),
        concurrent=(
            Req("a red cat", dict(num_inference_steps=8, guidance_scale=4.5, seed=1)),
            Req("green square and yellow circle", dict(num_inference_steps=6, guidance_scale=1.0, seed=2)),
            Req(
                "mountains at sunset",
                dict(num_inference_steps=5, guidance_scale=2.0, seed=3, num_outputs_per_prompt=2),
                negative_prompt="dark",
            ),
            Req("city skyline", dict(num_inference_steps=7, guidance_scale=7.0, seed=4)),
        ),
        http=Req(
            "a red cat",
            dict(num_inference_steps=3, guidance_scale=4.0, seed=3, num_outputs_per_prompt=2),
            negative_prompt="blurry",
        ),
    ),
    ImageFamily(
        # 32x48 pixels: a 2x3 grid of folded 2x2 latent patches; a short text length keeps the encoder cheap
        name="flux2_klein",
        diffusers_class="Flux2KleinPipeline",
        size=dict(height=32, width=48, max_sequence_length=32),
        # diffusers feeds the first step its packed latents as a permuted (non-contiguous) view, which rounds the
        # first linear layer differently (3e-7) from the engine's concatenated CFG rows: 1.3e-6 after 3 steps
        solo_tol=2e-6,
        latent_view=flux2_unpacked,
        solo=(
            Req("a red cat on a chair", dict(num_inference_steps=3, guidance_scale=4.0, seed=11), id="cfg"),
            Req(
                "a red cat on a chair",
                dict(num_inference_steps=3, guidance_scale=1.0, seed=11, num_outputs_per_prompt=2),
                id="no-cfg-two-outputs",
            ),
        ),
        concurrent=(
            Req("a red cat", dict(num_inference_steps=7, guidance_scale=4.0, seed=1)),
            Req("green square and yellow circle", dict(num_inference_steps=5, guidance_scale=1.0, seed=2)),
            Req(
                "mountains at sunset", dict(num_inference_steps=6, guidance_scale=2.5, seed=3, num_outputs_per_prompt=2)
            ),
            Req("city skyline", dict(num_inference_steps=4, guidance_scale=6.0, seed=4)),
        ),
        http=Req("a red cat", dict(num_inference_steps=3, guidance_scale=3.0, seed=3, num_outputs_per_prompt=2)),
    ),
    ImageFamily(
        # FLUX.2 [dev]: the [klein] grid; the pipeline's system turn (~40 tiny tokens) precedes every prompt, so
        # 64 text tokens; guidance is the distilled embedding (per row, no CFG pass)
        name="flux2",
        diffusers_class="Flux2Pipeline",
        size=dict(height=32, width=48, max_sequence_length=64),
        # exact in every run but one full run (2026-12-05), where four flux2 comparisons in one xdist worker were
        # one or two float32 steps off (2.4e-7 at |x| ~ 3); not isolated: [klein]'s rounding from the permuted
        # view (its row above), or that worker's thread settings after an in-process vLLM engine (it replaces
        # torch.set_num_threads). Four steps at that magnitude.
        solo_tol=1e-6,
        solo=(
            Req("a red cat on a chair", dict(num_inference_steps=3, guidance_scale=4.0, seed=11), id="guidance"),
            Req(
                "a red cat on a chair",
                dict(num_inference_steps=3, guidance_scale=1.5, seed=11, num_outputs_per_prompt=2),
                id="two-outputs",
            ),
        ),
        # different prompts, seeds, steps and guidance embeddings in one forward
        concurrent=(
            Req("a red cat", dict(num_inference_steps=7, guidance_scale=4.0, seed=1)),
            Req("green square and yellow circle", dict(num_inference_steps=5, guidance_scale=1.0, seed=2)),
            Req(
                "mountains at sunset", dict(num_inference_steps=6, guidance_scale=2.5, seed=3, num_outputs_per_prompt=2)
            ),
            Req("city skyline", dict(num_inference_steps=4, guidance_scale=6.0, seed=4)),
        ),
        http=Req("a red cat", dict(num_inference_steps=3, guidance_scale=3.0, seed=3, num_outputs_per_prompt=2)),
    ),
    ImageFamily(
        # 32x48 pixels -> 2x3 packed tokens; a short text length keeps the Qwen3 encoder cheap
        name="ovis_image",
        diffusers_class="OvisImagePipeline",
        size=dict(height=32, width=48, max_sequence_length=32),
        solo=(
            Req("a red cat on a chair", dict(num_inference_steps=4, guidance_scale=5.0, seed=11), id="cfg"),
            Req("a red cat on a chair", dict(num_inference_steps=3, guidance_scale=1.0, seed=11), id="no-cfg"),
            Req(
                "a red cat on a chair",
                dict(num_inference_steps=3, guidance_scale=3.0, seed=5, num_outputs_per_prompt=2),
                negative_prompt="blurry",
                id="negative-two-outputs",
            ),
        ),
        concurrent=(
            Req("a red cat", dict(num_inference_steps=8, guidance_scale=5.0, seed=1)),
            Req("green square and yellow circle", dict(num_inference_steps=6, guidance_scale=1.0, seed=2)),
            Req(
                "mountains at sunset",
                dict(num_inference_steps=5, guidance_scale=2.0, seed=3, num_outputs_per_prompt=2),
                negative_prompt="dark",
            ),
            Req("city skyline", dict(num_inference_steps=7, guidance_scale=7.0, seed=4)),
        ),
        http=Req(
            "a red cat",
            dict(num_inference_steps=3, guidance_scale=4.0, seed=3, num_outputs_per_prompt=2),
            negative_prompt="blurry",
        ),
    ),
    ImageFamily(
        # 32x48 pixels -> 2x3 packed tokens; every prompt is 512 text tokens (the pipeline's fixed padding)
        name="longcat_image",
        diffusers_class="LongCatImagePipeline",
        size=dict(height=32, width=48),
        # diffusers' default rewrites the prompt with the text encoder (off here unless asked: adapter.py)
        extra=dict(enable_prompt_rewrite=False),
        solo=(
            Req("a red cat on a chair", dict(num_inference_steps=4, guidance_scale=4.5, seed=11), id="cfg-renorm"),
            Req("a red cat on a chair", dict(num_inference_steps=3, guidance_scale=1.0, seed=11), id="no-cfg"),
            Req(
                "a sign that says 'hi'",
                dict(
                    num_inference_steps=3,
                    guidance_scale=3.0,
                    seed=5,
                    num_outputs_per_prompt=2,
                    extra_args=dict(enable_cfg_renorm=False),
                ),
                negative_prompt="blurry",
                id="negative-two-outputs-no-renorm",
            ),
            Req(
                "a red cat on a chair",
                dict(num_inference_steps=3, guidance_scale=6.0, seed=5, extra_args=dict(cfg_renorm_min=0.5)),
                id="renorm-min",
            ),
        ),
        concurrent=(
            Req("a red cat", dict(num_inference_steps=8, guidance_scale=4.5, seed=1)),
            Req("green square and yellow circle", dict(num_inference_steps=6, guidance_scale=1.0, seed=2)),
            Req(
                "mountains at sunset",
                dict(num_inference_steps=5, guidance_scale=2.0, seed=3, num_outputs_per_prompt=2),
                negative_prompt="dark",
            ),
            Req(
                "city skyline",
                dict(num_inference_steps=7, guidance_scale=7.0, seed=4, extra_args=dict(enable_cfg_renorm=False)),
            ),
        ),
        http=Req(
            "a red cat",
            dict(num_inference_steps=3, guidance_scale=4.0, seed=3, num_outputs_per_prompt=2),
            negative_prompt="blurry",
        ),
    ),
    ImageFamily(
        # VAE factor 16 and 2x2 slots: 64x96 pixels are a 4x6 latent grid (2x3 slots)
        name="qwen_image_21",
        diffusers_class="QwenImage21Pipeline",
        size=dict(height=64, width=96),
        solo=(
            Req(
                "a red cat sitting on a blue chair",
                dict(num_inference_steps=3, true_cfg_scale=3.0, seed=11),
                negative_prompt="blurry, low quality",
                id="true-cfg",
            ),  # other text lengths
            # the default scale (1.0): no CFG, as diffusers
            Req(
                "a red cat sitting on a blue chair",
                dict(num_inference_steps=3, seed=11, num_outputs_per_prompt=2),
                id="no-cfg-two-outputs",
            ),
        ),
        # different prompts, seeds, steps, true-CFG scales; RoPE puts the image after the text, so only prompts of
        # one token length share a forward (the batch key): 28 tiny tokens each, the negatives 23
        # (a CFG request's key holds its negative's length too: the two of each kind arrive one after the other)
        concurrent=(
            Req("blue circle", dict(num_inference_steps=8, seed=1)),
            Req("green square", dict(num_inference_steps=5, seed=3, num_outputs_per_prompt=2)),
            Req("city skyline", dict(num_inference_steps=6, seed=2, true_cfg_scale=4.0), negative_prompt="dark"),
            Req("low quality", dict(num_inference_steps=7, seed=4, true_cfg_scale=2.5), negative_prompt="ugly"),
        ),
        http=Req(
            "a red cat on a blue chair",
            dict(num_inference_steps=3, true_cfg_scale=3.0, seed=3, num_outputs_per_prompt=2),
            negative_prompt="blurry",
        ),
    ),
    ImageFamily(
        # VAE factor 16 (8 x the 2x2 patches): 32x48 pixels are a 2x3 latent grid; prompts of any token length
        # share a forward (the transformer masks the padding)
        name="ernie_image",
        diffusers_class="ErnieImagePipeline",
        size=dict(height=32, width=48),
        # diffusers' default rewrites the prompt with the enhancer (its own test: tests/models/ernie_image)
        extra=dict(use_pe=False),
        solo=(
            Req("a red cat on a chair", dict(num_inference_steps=4, guidance_scale=4.0, seed=11), id="cfg"),
            Req(
                "a red cat on a chair",
                dict(num_inference_steps=3, guidance_scale=1.0, seed=5, num_outputs_per_prompt=2),
                id="no-cfg-two-outputs",
            ),
            Req(
                "mountains at sunset",
                dict(num_inference_steps=3, guidance_scale=3.0, seed=5, num_outputs_per_prompt=2),
                negative_prompt="blurry, dark",
                id="negative-two-outputs",
            ),
        ),
        concurrent=(
            Req("a red cat", dict(num_inference_steps=8, guidance_scale=4.0, seed=1)),
            Req("green square and yellow circle", dict(num_inference_steps=6, guidance_scale=1.0, seed=2)),
            Req(
                "mountains at sunset",
                dict(num_inference_steps=5, guidance_scale=2.0, seed=3, num_outputs_per_prompt=2),
                negative_prompt="dark",
            ),
            Req("city skyline at night", dict(num_inference_steps=7, guidance_scale=6.0, seed=4)),
        ),
        http=Req(
            "a red cat",
            dict(num_inference_steps=3, guidance_scale=4.0, seed=3, num_outputs_per_prompt=2),
            negative_prompt="blurry",
        ),
    ),
]


def by_name(name: str) -> ImageFamily:
    return next(f for f in FAMILIES if f.name == name)


def solo_cases() -> list[tuple[ImageFamily, Req]]:
    return [(f, r) for f in FAMILIES for r in f.solo]
