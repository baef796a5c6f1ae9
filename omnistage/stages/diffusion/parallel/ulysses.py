"""Ulysses sequence parallelism on a diffusers transformer, with diffusers' own context-parallel machinery.

diffusers (0.42) splits a model's inputs along the sequence and gathers its output with hooks placed by
a *plan* (``ContextParallelModelPlan``: which module's inputs/outputs to split or gather), and its
attention dispatch runs Ulysses (all-to-all from sequence to heads, attention over the whole sequence,
all-to-all back) when an attention processor carries a ``ParallelConfig``. Its ``enable_parallelism``
does both, but picks the device as ``rank % torch.accelerator.device_count()``, which is a division by
zero on a CPU-only machine; ``enable_ulysses`` makes the same three calls itself (config setup on the
replica's mesh, the config on every processor, the plan's hooks), so gloo on CPU and NCCL on GPUs take
the same path.

- FLUX.1, Wan and Qwen-Image ship a plan (``_cp_plan``) and dispatching processors: used as they are.
- SD3's MMDiT ships neither and its ``JointAttnProcessor2_0`` calls ``F.scaled_dot_product_attention``
  directly. Its plan splits the patch embedding's and the caption projection's outputs and gathers
  ``proj_out``; each processor is wrapped so that inside it that SDPA call is routed (a
  ``TorchFunctionMode``, torch's own override mechanism) to diffusers' dispatch with the config: the
  processor's code runs unchanged, the joint [image; text] sequence of each rank goes through Ulysses.
- Z-Image ships no plan. Its refiners run on every rank (they see the image and the caption apart, and
  are two layers of thirty); the main layers' unified sequence, its mask and its RoPE table are split
  at each layer's input and the final layer's output is gathered.

``ulysses_anything`` (uneven splits) is always on: text lengths (SD3's 77 + 256 tokens, Qwen-Image's
unpadded prompts) and token grids need not divide by the degree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F


def _our_plans() -> dict[str, dict[str, Any]]:
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    return {
        "SD3Transformer2DModel": {
            "pos_embed": {0: ContextParallelInput(split_dim=1, expected_dims=3, split_output=True)},
            "context_embedder": {0: ContextParallelInput(split_dim=1, expected_dims=3, split_output=True)},
            "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3),
        },
        "ZImageTransformer2DModel": {
            "layers.0": {"x": ContextParallelInput(split_dim=1, expected_dims=3)},
            "layers.*": {
                "attn_mask": ContextParallelInput(split_dim=1, expected_dims=2),
                "freqs_cis": ContextParallelInput(split_dim=1, expected_dims=3),
                "noise_mask": ContextParallelInput(split_dim=1, expected_dims=2),
            },
            # the patch-2 / frame-patch-1 head: the only one the Z-Image checkpoints have
            "all_final_layer.2-1": ContextParallelOutput(gather_dim=1, expected_dims=3),
        },
    }


# processors whose SDPA call is routed through Ulysses (they compute self-attention over the rank's tokens)
_SDPA_PROCESSORS = {"SD3Transformer2DModel": ("JointAttnProcessor2_0",)}

SUPPORTED = (
    "FluxTransformer2DModel",
    "WanTransformer3DModel",
    "QwenImageTransformer2DModel",
    "SD3Transformer2DModel",
    "ZImageTransformer2DModel",
)


def plan_for(model: torch.nn.Module) -> dict[str, Any]:
    name = type(model).__name__
    plan = _our_plans().get(name) or (getattr(model, "_cp_plan", None) if name in SUPPORTED else None)
    if plan is None:
        raise ValueError(f"{name} has no sequence-parallel plan (models with one: {', '.join(SUPPORTED)})")
    return plan


def unsupported_in_folder(folder: str | None) -> list[str]:
    """The denoiser classes a diffusers model folder declares (``model_index.json``) that have no plan: the
    launcher refuses them before starting any rank. A folder without the file is left to ``plan_for``."""
    index = Path(folder or "") / "model_index.json"
    if not index.is_file():
        return []
    entries = json.loads(index.read_text())
    found = [
        entries[k][1]
        for k in ("transformer", "transformer_2", "unet")
        if isinstance(entries.get(k), list) and len(entries[k]) == 2 and entries[k][1]
    ]
    return [name for name in found if name not in SUPPORTED]


class _UlyssesSDPA(torch.overrides.TorchFunctionMode):
    """Inside it, ``F.scaled_dot_product_attention`` on ``[B, H, S_local, D]`` runs as Ulysses attention."""

    def __init__(self, config: Any):
        super().__init__()
        self.config = config

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        from diffusers.models.attention_dispatch import AttentionBackendName, dispatch_attention_fn

        q, k, v = (kwargs.pop(n) if n in kwargs else a for n, a in zip(("query", "key", "value"), args[:3]))
        if args[3:] or kwargs.get("is_causal") or kwargs.get("dropout_p"):
            raise NotImplementedError("Ulysses SDPA: positional mask, causal attention and dropout are not routed")
        out = dispatch_attention_fn(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=kwargs.get("attn_mask"),
            scale=kwargs.get("scale"),
            backend=AttentionBackendName.NATIVE,
            parallel_config=self.config,
        )
        return out.transpose(1, 2)


class UlyssesProcessor:
    """A diffusers attention processor run with its SDPA call made Ulysses attention."""

    def __init__(self, inner: Any, config: Any):
        self.inner = inner
        self.config = config

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with _UlyssesSDPA(self.config):
            return self.inner(*args, **kwargs)


def _check_backend(processor: Any) -> None:
    # a backend without context-parallel support would drop the config silently and attend locally
    from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

    backend = processor._attention_backend
    backend = (
        AttentionBackendName(backend) if backend is not None else _AttentionBackendRegistry.get_active_backend()[0]
    )
    if not _AttentionBackendRegistry._is_context_parallel_available(backend):
        raise ValueError(
            f"the attention backend {backend.value!r} has no context-parallel "
            "support in diffusers (use the default 'native' backend, or flash / sage)"
        )


def enable_ulysses(model: torch.nn.Module, rank: int, mesh: Any, device: torch.device) -> None:
    """Split ``model``'s sequence over the ``ulysses`` dimension of ``mesh`` (a ("ring", "ulysses") mesh)."""
    from diffusers.hooks.context_parallel import apply_context_parallel
    from diffusers.models._modeling_parallel import ContextParallelConfig, ParallelConfig

    name = type(model).__name__
    plan = plan_for(model)
    degree = mesh["ulysses"].size()
    cp = ContextParallelConfig(ulysses_degree=degree, mesh=mesh, ulysses_anything=True)
    config = ParallelConfig(context_parallel_config=cp)
    config.setup(rank, torch.distributed.get_world_size(), device, mesh=mesh)
    wrap = _SDPA_PROCESSORS.get(name, ())
    for module in model.modules():
        processor = getattr(module, "processor", None)
        if processor is None or not hasattr(module, "set_processor"):
            continue
        if hasattr(processor, "_parallel_config"):  # attention through diffusers' dispatch: it takes the config
            _check_backend(processor)
            processor._parallel_config = config
        elif type(processor).__name__ in wrap:
            module.set_processor(UlyssesProcessor(processor, config))
        else:
            raise ValueError(f"{name} has an attention processor omnistage cannot split ({type(processor).__name__})")
    apply_context_parallel(model, cp, plan)
