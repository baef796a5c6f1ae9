"""Train the built-in demo text-to-image model (an SD3-style diffusers folder) on synthetic shapes.

    python demo/train_shapes.py --out /tmp/demo --minutes 6.5      # the defaults are the shipped recipe

reproduces the shipped weights when given the step counts recorded in
``weights/training_info.json`` (its ``command``: exact step counts for each phase; a time budget alone
picks the step counts from the measured speed of the machine it runs on). The shipped run took ~5 min on
one H200 (``demo/sweep_gpu.sh``, ``demo/RESULTS.md``); on a 2-core CPU the same steps take about 5 hours.

Components (``demo/components.py``; all real diffusers / transformers classes, served by the sd3 family):
  * tokenizer: CLIP BPE built here from the caption vocabulary (one token per word),
    ``model_max_length`` 16;
  * text_encoder / text_encoder_2: two tiny ``CLIPTextModelWithProjection``, trained jointly
    with the transformer; text_encoder_3 (T5) is absent, so SD3 feeds zeros in its place;
  * vae: a small ``AutoencoderKL`` with 4x down-sampling (64x64x3 -> 16x16x4), trained first;
    its decoder is refined last, on the frozen encoder's latents (see ``refine_decoder``);
  * transformer: a small ``SD3Transformer2DModel`` (MMDiT, patch 1: a token per latent pixel),
    rectified-flow objective with extra weight on the latent pixels the shape touches — without it
    the loss is nearly all flat background and every shape comes out as the same blob;
  * scheduler: ``FlowMatchEulerDiscreteScheduler`` (shift 1).

The SD3 pipeline pads the text with ``max_sequence_length`` zero "T5" tokens; the model is
trained with exactly ``T5_TOKENS`` of them, and the demo pipeline passes the same number.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from demo.components import (  # noqa: E402
    T5_TOKENS,
    build_text_encoder,
    build_tokenizer,
    build_transformer,
    build_vae,
    encode_text,
)
from demo.shapes import caption, make_dataset  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- helpers


def to_tensor(images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(images).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)


class EMA:
    """Exponential moving average of parameters, with a warm-up so short runs are not stale."""

    def __init__(self, modules: list[torch.nn.Module], decay: float):
        self.decay = decay
        self.shadow = [copy.deepcopy(m).requires_grad_(False) for m in modules]
        self.modules = modules
        self.n = 0

    @torch.no_grad()
    def update(self) -> None:
        self.n += 1
        d = min(self.decay, (1 + self.n) / (10 + self.n))
        for s, m in zip(self.shadow, self.modules):
            for ps, pm in zip(s.parameters(), m.parameters()):
                ps.lerp_(pm, 1 - d)


def timed_steps(step_fn, steps: int | None, seconds: float, calib: int = 20, warm: int = 3) -> int:
    """Run ``steps`` steps, or as many as fit in ``seconds`` judged from the first ``calib``
    (timed after ``warm`` of them: first steps pay one-off start-up costs, on a GPU most of all).

    The first ``calib`` steps run without a known total either way (learning-rate schedules
    hold their initial value there), so a recorded step count reproduces a timed run exactly."""
    t0 = time.time()
    first = calib if steps is None else min(calib, steps)
    for i in range(first):
        if i == warm:
            t_warm = time.time()
        step_fn(i, None)
    if steps is None:
        per = (time.time() - t_warm) / (calib - warm)
        steps = max(calib, int((seconds - (t_warm - t0)) / per))
        log(f"  {per * 1000:.0f} ms/step -> {steps} steps in {seconds / 60:.1f} min")
    for i in range(first, steps):
        step_fn(i, steps)
    return steps


# ---------------------------------------------------------------- training stages


def foreground_weight(x: torch.Tensor, weight: float) -> torch.Tensor:
    """1 on the background, 1 + weight on the shape (backgrounds are flat: the corner pixel is one)."""
    corner = x[:, :, :1, :1]
    return 1.0 + weight * ((x - corner).abs().amax(dim=1, keepdim=True) > 0.1).float()


def train_vae(
    vae, images: torch.Tensor, steps: int | None, seconds: float, rng: torch.Generator, batch: int, fg_weight: float
):
    opt = torch.optim.AdamW(vae.parameters(), lr=2e-3, weight_decay=0.0)
    losses: list[float] = []
    plan = {"total": None}

    def step(i: int, total: int | None):
        if total is not None and plan["total"] is None:
            plan["total"] = total
        lr = 2e-3 if plan["total"] is None else 2e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * i / plan["total"])))
        for g in opt.param_groups:
            g["lr"] = lr
        idx = torch.randint(0, len(images), (batch,), generator=rng)
        x = images[idx]
        post = vae.encode(x).latent_dist
        z = post.mean + post.std * torch.randn(post.mean.shape, generator=rng).to(x.device)
        rec = vae.decode(z).sample
        kl = post.kl().mean() / x[0].numel()
        if fg_weight:
            # the shape covers a few percent of the picture: without extra weight the VAE learns the
            # background and loses the shape's hue
            loss = (foreground_weight(x, fg_weight) * ((rec - x) ** 2 + (rec - x).abs())).mean() + 1e-4 * kl
        else:
            loss = F.mse_loss(rec, x) + F.l1_loss(rec, x) + 1e-4 * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if i % 50 == 0:
            log(f"  vae step {i}: loss {np.mean(losses[-50:]):.4f} lr {lr:.2e}")

    n = timed_steps(step, steps, seconds)
    return n, float(np.mean(losses[-50:]))


def refine_decoder(
    vae,
    images: torch.Tensor,
    means: torch.Tensor,
    stds: torch.Tensor,
    steps: int | None,
    seconds: float,
    rng: torch.Generator,
    batch: int,
):
    """Train the VAE decoder alone on the frozen encoder's latents, weighting the shape's pixels.

    Joint VAE training spends almost all of its loss on the flat background and in a short run
    decodes the shapes as grey blobs; the encoder (and so the transformer trained on its latents)
    is kept, only the decoder learns to draw the colours and edges back."""
    params = [p for n, p in vae.named_parameters() if n.startswith(("decoder.", "post_quant_conv."))]
    vae.requires_grad_(False)
    for q in params:
        q.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)
    losses: list[float] = []
    plan = {"total": None}

    def step(i: int, total: int | None):
        if total is not None and plan["total"] is None:
            plan["total"] = total
        lr = 1e-3 if plan["total"] is None else 1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * i / plan["total"])))
        for g in opt.param_groups:
            g["lr"] = lr
        idx = torch.randint(0, len(images), (batch,), generator=rng)
        x = images[idx]
        # random numbers come from a CPU generator on every device, so a run's draws do not depend on it
        z = means[idx] + stds[idx] * torch.randn(means[idx].shape, generator=rng).to(means.device)  # a posterior sample
        rec = vae.decode(z).sample
        loss = (foreground_weight(x, 20.0) * ((rec - x) ** 2 + (rec - x).abs())).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if i % 50 == 0:
            log(f"  decoder step {i}: loss {np.mean(losses[-50:]):.4f} lr {lr:.2e}")

    n = timed_steps(step, steps, seconds)
    vae.requires_grad_(False)
    return n, float(np.mean(losses[-50:]))


def train_dit(
    transformer, encoders, tok, latents, masks, scenes, steps, seconds, rng, np_rng, batch, lr_max, fg_weight
):
    params = list(transformer.parameters()) + [p for e in encoders for p in e.parameters()]
    opt = torch.optim.AdamW(params, lr=lr_max, weight_decay=0.0, betas=(0.9, 0.99))
    ema = EMA([transformer, *encoders], decay=0.995)
    losses: list[float] = []
    plan = {"total": None}
    warmup = 100

    def step(i: int, total: int | None):
        if total is not None and plan["total"] is None:
            plan["total"] = total
        if i < warmup:
            lr = lr_max * (i + 1) / warmup
        elif plan["total"] is None:
            lr = lr_max
        else:
            lr = lr_max * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * (i - warmup) / max(1, plan["total"] - warmup))))
        for g in opt.param_groups:
            g["lr"] = lr
        idx = torch.randint(0, len(latents), (batch,), generator=rng)
        x0 = latents[idx]
        # 10% empty captions teach the unconditional branch used by classifier-free guidance
        prompts = ["" if np_rng.random() < 0.1 else caption(scenes[j], np_rng) for j in idx.tolist()]
        prompt_embeds, pooled = encode_text(tok, encoders, prompts, x0.device)
        # rectified flow: x_t = (1 - s) x0 + s noise, predict (noise - x0); logit-normal s
        sigma = torch.sigmoid(torch.randn(batch, generator=rng)).to(x0.device)
        noise = torch.randn(x0.shape, generator=rng).to(x0.device)
        s = sigma.view(-1, 1, 1, 1)
        xt = (1 - s) * x0 + s * noise
        pred = transformer(
            hidden_states=xt, encoder_hidden_states=prompt_embeds, pooled_projections=pooled, timestep=sigma * 1000
        ).sample
        # the shape covers a few latent pixels: weighting them keeps the loss from being all background
        loss = ((1.0 + fg_weight * masks[idx]) * (pred - (noise - x0)) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        ema.update()
        losses.append(loss.item())
        if i % 50 == 0:
            log(f"  dit step {i}: loss {np.mean(losses[-50:]):.4f} lr {lr:.2e}")

    n = timed_steps(step, steps, seconds)
    return n, float(np.mean(losses[-100:])), ema


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "omnistage/models/demo/weights"))
    p.add_argument(
        "--minutes",
        type=float,
        default=6.5,
        help="total time budget, used when step counts are not given (the shipped run: 6.5 on an H200)",
    )
    p.add_argument("--vae-fraction", type=float, default=0.2, help="share of the budget spent on the VAE")
    p.add_argument("--vae-steps", type=int, default=None, help="exact VAE steps (reproduces a recorded run)")
    p.add_argument("--dit-steps", type=int, default=None, help="exact transformer steps (reproduces a recorded run)")
    p.add_argument("--decoder-fraction", type=float, default=0.1, help="share of the budget spent refining the decoder")
    p.add_argument("--decoder-steps", type=int, default=None, help="exact decoder-refinement steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--images", type=int, default=20000, help="size of the synthetic training set")
    p.add_argument("--width", type=int, default=128, help="transformer hidden size")
    p.add_argument("--layers", type=int, default=6, help="transformer blocks")
    p.add_argument("--patch-size", type=int, default=1, help="transformer patch size on the 16x16 latent")
    p.add_argument("--vae-channels", default="16,32,32", help="VAE block widths (3 blocks: 4x down-sampling)")
    p.add_argument(
        "--dit-fg-weight", type=float, default=4.0, help="extra transformer loss weight on the shape's latents"
    )
    p.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cpu or cuda (random draws come from CPU generators either way)",
    )
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--vae-batch", type=int, default=32)
    p.add_argument("--vae-fg-weight", type=float, default=20.0, help="extra loss weight on the shape's pixels")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True  # tiny matmuls; TF32 is ample for training
    dev = torch.device(args.device)
    t_start = time.time()
    budget = args.minutes * 60
    out = Path(args.out)

    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    log(f"rendering {args.images} images")
    images_np, scenes = make_dataset(args.images, seed=args.seed)
    images = to_tensor(images_np).to(dev)
    rng = torch.Generator().manual_seed(args.seed)
    np_rng = np.random.default_rng(args.seed + 1)

    tok = build_tokenizer()
    vae = build_vae(tuple(int(c) for c in args.vae_channels.split(","))).to(dev)
    enc1 = build_text_encoder(len(tok), tok).to(dev)
    enc2 = build_text_encoder(len(tok), tok).to(dev)
    transformer = build_transformer(args.width, args.layers, args.patch_size).to(dev)
    n_params = sum(q.numel() for m in (vae, enc1, enc2, transformer) for q in m.parameters())
    log(f"parameters: {n_params / 1e6:.2f} M")

    log("training the VAE")
    vae_budget = budget * args.vae_fraction - (time.time() - t_start)
    vae_steps, vae_loss = train_vae(vae, images, args.vae_steps, vae_budget, rng, args.vae_batch, args.vae_fg_weight)
    vae.eval().requires_grad_(False)

    log("encoding the training set")
    with torch.no_grad():
        dists = [vae.encode(images[i : i + 256]).latent_dist for i in range(0, len(images), 256)]
        means, stds = torch.cat([d.mean for d in dists]), torch.cat([d.std for d in dists])
    shift, scale = float(means.mean()), float(1.0 / means.std())
    vae.register_to_config(shift_factor=shift, scaling_factor=scale)
    latents = (means - shift) * scale
    # which latent pixels the shape touches (the picture's foreground, pooled to the latent grid)
    masks = (F.adaptive_max_pool2d(foreground_weight(images, 1.0) - 1.0, latents.shape[-2:]) > 0).float()
    log(f"  latent shift {shift:.4f} scale {scale:.4f}")

    log("training the transformer and text encoders")
    dit_budget = budget * (1 - args.decoder_fraction) - (time.time() - t_start) - 30  # leave time to save
    dit_steps, dit_loss, ema = train_dit(
        transformer,
        [enc1, enc2],
        tok,
        latents,
        masks,
        scenes,
        args.dit_steps,
        dit_budget,
        rng,
        np_rng,
        args.batch,
        args.lr,
        args.dit_fg_weight,
    )
    transformer, enc1, enc2 = ema.shadow

    log("refining the VAE decoder")
    dec_budget = budget - (time.time() - t_start) - 30
    dec_rng = torch.Generator().manual_seed(args.seed + 2)  # its own stream: earlier phases stay reproducible
    dec_steps, dec_loss = refine_decoder(
        vae, images, means, stds, args.decoder_steps, dec_budget, dec_rng, args.vae_batch
    )
    vae.eval()
    with torch.no_grad():
        recon_err = float((vae.decode(means[:256]).sample - images[:256]).abs().mean())
    log(f"  reconstruction L1 {recon_err:.4f}")

    pipe = StableDiffusion3Pipeline(
        transformer=transformer.eval().cpu(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=1.0),
        vae=vae.cpu(),
        text_encoder=enc1.eval().cpu(),
        tokenizer=tok,
        text_encoder_2=enc2.eval().cpu(),
        tokenizer_2=tok,
        text_encoder_3=None,
        tokenizer_3=None,
    )
    out.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(out, safe_serialization=True)
    # model_index.json records T5 as [null, null]; loading needs text_encoder_3=None, tokenizer_3=None
    # (omnistage.models.demo.adapter.DemoAdapter passes them).
    (out / "omnistage.json").write_text(json.dumps({"pipeline": "demo"}) + "\n")
    info = {
        "command": "python demo/train_shapes.py "
        + " ".join(
            f"--{k.replace('_', '-')} {v}"
            for k, v in vars(args).items()
            if k not in ("out", "vae_steps", "dit_steps", "decoder_steps", "minutes")
        )
        + f" --vae-steps {vae_steps} --dit-steps {dit_steps} --decoder-steps {dec_steps}",
        "seed": args.seed,
        "vae_steps": vae_steps,
        "dit_steps": dit_steps,
        "decoder_steps": dec_steps,
        "vae_final_loss": round(vae_loss, 5),
        "vae_reconstruction_l1": round(recon_err, 5),
        "dit_final_loss": round(dit_loss, 5),
        "decoder_final_loss": round(dec_loss, 5),
        "parameters_millions": round(n_params / 1e6, 3),
        "max_sequence_length": T5_TOKENS,
        "minutes": round((time.time() - t_start) / 60, 1),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
    }
    (out / "training_info.json").write_text(json.dumps(info, indent=2) + "\n")
    log(f"saved {out} ({sum(f.stat().st_size for f in out.rglob('*') if f.is_file()) / 1e6:.1f} MB): {info}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
