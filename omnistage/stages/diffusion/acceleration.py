"""A diffusion stage's ``acceleration:`` (config/stage_sections.py ``AccelerationConfig``) applied to its adapter.

- ``cache``: per-request step caching inside the step batches (step_cache.py); DiT families only.
- ``compile``: ``torch.compile`` with dynamic shapes. Regional: each declared transformer block is
  compiled (diffusers' ``compile_repeated_blocks`` idea), so the step cache's per-row decisions and
  the offload hooks stay outside the compiled graphs, and batch-size changes reuse the graphs
  (dynamo specialises size 1, so batch 1 and batch >= 2 compile once each). A family without a block
  layout (the UNet family) has its denoiser compiled whole.
- ``offload``: ``model`` = diffusers' ``enable_model_cpu_offload`` (accelerate hooks move a whole
  component to the device while it runs); ``layer`` = diffusers' group offloading, one block per group,
  streamed with prefetch on CUDA (synchronous elsewhere). The step-cache hooks are installed first,
  so the offload hooks wrap them: every block is still brought in on every step, in order, which is
  what the prefetching relies on; the cache saves compute there, not transfers.
- ``vae_tiling``: diffusers' tiled VAE decode/encode (``vae.enable_tiling()``), as the pipelines use it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from omnistage.stages.diffusion.adapter import DiffusionAdapter
from omnistage.stages.diffusion.cache_rules import make_rule
from omnistage.stages.diffusion.step_cache import StepHooks


class Acceleration:
    """What a stage applied; ``hooks`` go to every step (runner.run_step), ``close`` removes them."""

    def __init__(self, hooks: StepHooks | None = None):
        self.hooks = hooks

    def close(self) -> None:
        if self.hooks is not None:
            self.hooks.close()
            self.hooks = None


def compiler(backend: str | Callable[..., Any] = "inductor") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def compile_fn(fn: Callable[..., Any]) -> Callable[..., Any]:
        return torch.compile(fn, dynamic=True, backend=backend)

    return compile_fn


def apply_acceleration(
    adapter: DiffusionAdapter,
    cfg: Any,
    where: str = "acceleration",
    compile_backend: str | Callable[..., Any] = "inductor",
) -> Acceleration:
    """Apply ``cfg`` (an ``AccelerationConfig`` or None) to a loaded adapter. Errors name ``where.<key>``."""
    if cfg is None:
        return Acceleration()
    family = type(adapter).__name__
    layouts = adapter.block_layouts()
    rule = None
    if cfg.cache is not None:
        if not layouts:
            raise ValueError(
                f"{where}.cache: {family} exposes no transformer block structure (block_layouts); "
                "step caching works with the DiT families"
            )
        try:
            rule = make_rule(cfg.cache)
        except ValueError as e:
            raise ValueError(f"{where}.cache: {e}") from None
    compile_fn = compiler(compile_backend) if cfg.compile else None
    pipe = getattr(adapter, "pipe", None)
    if (cfg.offload != "none" or cfg.vae_tiling) and pipe is None:
        raise ValueError(f"{where}: offload and vae_tiling need a diffusers pipeline; {family} has none")
    if compile_fn is not None and not layouts and cfg.offload != "none":
        raise ValueError(
            f"{where}: compile with offload needs the family's block layout (the whole-model "
            f"compile of {family} would trace the offload hooks)"
        )
    hooks = None
    try:
        if rule is not None or (compile_fn is not None and layouts):
            hooks = StepHooks(layouts, rule, compile_fn)  # before offload, so the offload hooks wrap them
        elif compile_fn is not None:
            for model in adapter.denoisers():
                model.compile(dynamic=True, backend=compile_backend)
        if cfg.vae_tiling:
            vae = getattr(pipe, "vae", None)
            if vae is None or not hasattr(vae, "enable_tiling"):
                raise ValueError(f"{where}.vae_tiling: {family}'s VAE has no tiled decode")
            vae.enable_tiling()
        device = getattr(adapter, "device", torch.device("cpu"))
        if cfg.offload == "model":
            pipe.enable_model_cpu_offload(device=device)
        elif cfg.offload == "layer":
            pipe.enable_group_offload(
                onload_device=device,
                offload_device=torch.device("cpu"),
                offload_type="block_level",
                num_blocks_per_group=1,
                use_stream=device.type == "cuda",
            )
    except Exception:
        if hooks is not None:
            hooks.close()
        raise
    return Acceleration(hooks)
