"""A straightforward per-request reference of the step-cache rules on SD3 (test-only).

One request, diffusers' own pipeline pieces and SD3Transformer2DModel's forward written out with the
cache rule in the middle, the way one would write it for a single request: no hooks, no batching.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class Rule:
    method: str  # first_block | teacache
    threshold: float
    warmup_steps: int = 0
    max_consecutive_cached: int | None = None
    coefficients: list[float] | None = None


@dataclass
class State:
    prev: torch.Tensor | None = None
    residual: torch.Tensor | None = None
    acc: float = 0.0
    streak: int = 0
    reused: int = 0
    rels: list[float] = field(default_factory=list)


def _rel(p: torch.Tensor, prev: torch.Tensor | None) -> float | None:
    return None if prev is None else ((p - prev).abs().mean() / prev.abs().mean()).item()


def _compute(rule: Rule, st: State, rel: float | None, step: int, total: int) -> bool:
    forced = (
        rel is None
        or step < rule.warmup_steps
        or (rule.max_consecutive_cached is not None and st.streak >= rule.max_consecutive_cached)
    )
    if rel is not None:
        st.rels.append(rel)
    if rule.method == "first_block":
        return forced or rel > rule.threshold
    if forced or step == total - 1:
        st.acc = 0.0
        return True
    st.acc += float(np.poly1d(rule.coefficients or [1.0, 0.0])(rel))
    if st.acc < rule.threshold:
        return False
    st.acc = 0.0
    return True


def transformer(tr, x, t, enc, pooled, rule: Rule, st: State, step: int, total: int, cond: slice) -> torch.Tensor:
    """SD3Transformer2DModel.forward with the cache rule; ``cond`` selects the request's cond rows."""
    height, width = x.shape[-2:]
    h = tr.pos_embed(x).contiguous()
    temb = tr.time_text_embed(t, pooled)
    e = tr.context_embedder(enc)
    blocks = tr.transformer_blocks
    if rule.method == "first_block":
        e, first = blocks[0](hidden_states=h, encoder_hidden_states=e, temb=temb)
        p = (first - h)[cond]
        anchor, rest = first, blocks[1:]
    else:
        p = blocks[0].norm1(h, emb=temb)[0][cond]
        anchor, rest = h, blocks
    rel = _rel(p, st.prev)
    compute = _compute(rule, st, rel, step, total)
    if compute or rule.method == "teacache":
        st.prev = p
    if compute:
        out = anchor
        for block in rest:
            e, out = block(hidden_states=out, encoder_hidden_states=e, temb=temb)
        st.residual = out - anchor
        st.streak = 0
    else:
        out = anchor + st.residual
        st.streak += 1
        st.reused += 1
    out = tr.proj_out(tr.norm_out(out, temb))
    p_ = tr.config.patch_size
    out = out.reshape(out.shape[0], height // p_, width // p_, p_, p_, tr.out_channels)
    out = torch.einsum("nhwpqc->nchpwq", out)
    return out.reshape(out.shape[0], tr.out_channels, height, width)


@torch.no_grad()
def generate(
    pipe,
    prompt: str,
    rule: Rule,
    *,
    seed: int,
    steps: int,
    guidance: float,
    height: int,
    width: int,
    negative_prompt: str | None = None,
) -> tuple[torch.Tensor, State]:
    """Final latents of one request (StableDiffusion3Pipeline.__call__'s loop) and its cache state."""
    do_cfg = guidance > 1
    embeds, neg, pooled, neg_pooled = pipe.encode_prompt(
        prompt=prompt,
        prompt_2=None,
        prompt_3=None,
        negative_prompt=negative_prompt,
        do_classifier_free_guidance=do_cfg,
        device=torch.device("cpu"),
        max_sequence_length=256,
    )
    if do_cfg:
        embeds, pooled = torch.cat([neg, embeds]), torch.cat([neg_pooled, pooled])
    tr = pipe.transformer
    latents = pipe.prepare_latents(
        1, tr.config.in_channels, height, width, embeds.dtype, torch.device("cpu"), torch.Generator().manual_seed(seed)
    )
    scheduler = copy.deepcopy(pipe.scheduler)
    scheduler.set_timesteps(steps)
    st = State()
    cond = slice(1, 2) if do_cfg else slice(0, 1)
    for i, t in enumerate(scheduler.timesteps):
        x = torch.cat([latents] * 2) if do_cfg else latents
        out = transformer(tr, x, t.expand(x.shape[0]), embeds, pooled, rule, st, i, steps, cond)
        if do_cfg:
            u, c = out.chunk(2)
            out = u + guidance * (c - u)
        latents = scheduler.step(out, t, latents, return_dict=False)[0]
    return latents, st


def flux2_transformer(rule: Rule) -> type:
    """Flux2Transformer2DModel with its forward written out and the rule in the middle, for one request without
    CFG (FLUX.2 [dev]: one call per step). After the double-stream blocks the text and image tokens run joined
    through the single-stream blocks; a reused step adds the cached residual of the image tokens."""
    from diffusers import Flux2Transformer2DModel

    class CachedFlux2(Flux2Transformer2DModel):
        state: State
        step: int = 0
        total: int = 0

        def forward(
            self,
            hidden_states,
            encoder_hidden_states,
            timestep,
            img_ids,
            txt_ids,
            guidance=None,
            return_dict=False,
            **_,
        ):
            st, step = self.state, self.step
            self.step += 1
            temb = self.time_guidance_embed(
                timestep.to(hidden_states.dtype) * 1000,
                None if guidance is None else guidance.to(hidden_states.dtype) * 1000,
            )
            mod_img, mod_txt = self.double_stream_modulation_img(temb), self.double_stream_modulation_txt(temb)
            mod_single = self.single_stream_modulation(temb)
            h, e = self.x_embedder(hidden_states), self.context_embedder(encoder_hidden_states)
            img_rot, txt_rot = self.pos_embed(img_ids[0]), self.pos_embed(txt_ids[0])
            rot = tuple(torch.cat([t, i], dim=0) for t, i in zip(txt_rot, img_rot))
            first, *rest = self.transformer_blocks
            if rule.method == "first_block":
                e, h1 = first(
                    hidden_states=h,
                    encoder_hidden_states=e,
                    temb_mod_img=mod_img,
                    temb_mod_txt=mod_txt,
                    image_rotary_emb=rot,
                )
                p, anchor = h1 - h, h1
            else:
                shift, scale, _ = torch.chunk(mod_img.unsqueeze(1), 6, dim=-1)[:3]
                p, anchor, rest = (1 + scale) * first.norm1(h) + shift, h, [first, *rest]
            rel = _rel(p, st.prev)
            compute = _compute(rule, st, rel, step, self.total)
            if compute or rule.method == "teacache":
                st.prev = p
            if compute:
                out = anchor
                for block in rest:
                    e, out = block(
                        hidden_states=out,
                        encoder_hidden_states=e,
                        temb_mod_img=mod_img,
                        temb_mod_txt=mod_txt,
                        image_rotary_emb=rot,
                    )
                x = torch.cat([e, out], dim=1)
                for block in self.single_transformer_blocks:
                    x = block(hidden_states=x, encoder_hidden_states=None, temb_mod=mod_single, image_rotary_emb=rot)
                out = x[:, e.shape[1] :]
                st.residual, st.streak = out - anchor, 0
            else:
                out = anchor + st.residual
                st.streak += 1
                st.reused += 1
            return (self.proj_out(self.norm_out(out, temb)),)

    return CachedFlux2
