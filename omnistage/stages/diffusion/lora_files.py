"""Read a diffusers-format LoRA file into per-layer low-rank weights for one pipeline's denoiser.

The file is read by the pipeline class's own ``lora_state_dict`` (diffusers' public LoRA entry
point): it accepts what ``load_lora_weights`` accepts for that family and converts the other key
layouts it knows (kohya / XLabs / BFL for FLUX, the old ``.lora.down`` diffusers layout) into
PEFT's ``<component>.<module>.lora_A/lora_B.weight``. Safetensors only (no pickles from a path a
client may name).

The per-layer scaling follows the rule PEFT applies when diffusers loads the same file, so a
request at ``lora_scale`` s equals diffusers with ``load_lora_weights`` and ``{"scale": s}``:
``scaling = alpha / r`` (``alpha / sqrt(r)`` with rsLoRA) per layer, where ``r`` is the layer's
rank and ``alpha``

- comes from the file's LoRA metadata (``lora_alpha``, ``alpha_pattern``) when diffusers saved one;
- else from the layer's ``.alpha`` entry (kohya-style network alphas), layers without one taking
  the most common alpha of the file;
- else equals ``r`` (scaling 1: PEFT's convention without alphas).

Only denoiser layers (``transformer``, ``transformer_2``, ``unet``) that are ``nn.Linear`` are
supported; anything else (text-encoder layers, convolutions, DoRA, LoRA biases) is refused with an
``InvalidRequestError`` naming ``lora_path``, as is a layer the model does not have or whose shape
differs (an adapter for another base model) and a rank above ``max_rank``.
"""

from __future__ import annotations

import collections
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from omnistage.errors import InvalidRequestError

DENOISERS = ("transformer", "transformer_2", "unet")
FIELD = "lora_path"


@dataclass(frozen=True)
class LayerLora:
    """One adapter's weights for one ``nn.Linear``: ``y += scaling * up(down(x))``."""

    down: torch.Tensor  # lora_A: [r, in]
    up: torch.Tensor  # lora_B: [out, r]
    scaling: float

    @property
    def rank(self) -> int:
        return self.down.shape[0]


@dataclass(frozen=True)
class LoraFile:
    path: str
    layers: dict[tuple[str, str], LayerLora]  # (component, module path) -> weights

    @property
    def rank(self) -> int:
        return max(w.rank for w in self.layers.values())


def read_lora_file(pipe: Any, path: str | Path, max_rank: int, field: str = FIELD) -> LoraFile:
    """``pipe``: the loaded diffusers pipeline whose denoiser(s) the adapter is for."""
    cls = type(pipe)
    if not hasattr(cls, "lora_state_dict"):
        raise InvalidRequestError(field, f"diffusers has no LoRA loader for {cls.__name__}")
    p = Path(path)
    if not p.exists():
        raise InvalidRequestError(field, f"{str(path)!r} does not exist")
    state_dict, alphas, metadata = _state_dict(cls, p, field)
    groups = _group(state_dict, alphas, field)
    if not groups:
        raise InvalidRequestError(field, f"{str(path)!r} holds no LoRA layers")
    common_alpha = _most_common([a for a in (g.get("alpha") for g in groups.values()) if a is not None])
    layers: dict[tuple[str, str], LayerLora] = {}
    for (component, module), g in sorted(groups.items()):
        model = getattr(pipe, component, None) if component in DENOISERS else None
        if not isinstance(model, nn.Module):
            raise InvalidRequestError(
                field,
                f"has layers for {component!r}; only the denoiser's layers "
                f"({', '.join(c for c in DENOISERS if getattr(pipe, c, None) is not None)}) "
                "are supported",
            )
        if "down" not in g or "up" not in g:
            raise InvalidRequestError(field, f"layer {component}.{module} lacks its lora_A or lora_B weight")
        linear = _linear(model, component, module, field)
        down, up = g["down"], g["up"]
        if (
            down.ndim != 2
            or up.ndim != 2
            or down.shape[1] != linear.in_features
            or up.shape[0] != linear.out_features
            or up.shape[1] != down.shape[0]
        ):
            raise InvalidRequestError(
                field,
                f"layer {component}.{module} has LoRA shapes {tuple(down.shape)} / "
                f"{tuple(up.shape)}, the model's layer is {linear.in_features} -> "
                f"{linear.out_features} (an adapter for another base model?)",
            )
        rank = down.shape[0]
        if rank > max_rank:
            raise InvalidRequestError(
                field, f"layer {component}.{module} has rank {rank}, above this server's max_lora_rank of {max_rank}"
            )
        meta = _component_metadata(metadata, component)
        scaling = _scaling(module, rank, g.get("alpha"), common_alpha, meta)
        layers[(component, module)] = LayerLora(down.contiguous(), up.contiguous(), scaling)
    return LoraFile(str(path), layers)


def _state_dict(cls: Any, p: Path, field: str) -> tuple[dict[str, torch.Tensor], dict[str, float], dict | None]:
    """The family's ``lora_state_dict`` on one safetensors file (or a folder holding one)."""
    import inspect

    folder, weight_name = (p.parent, p.name) if p.is_file() else (p, None)
    kwargs: dict[str, Any] = {"use_safetensors": True, "local_files_only": True, "return_lora_metadata": True}
    if weight_name is not None:
        kwargs["weight_name"] = weight_name
    # FLUX-style loaders hand network alphas back only when asked; SD-style ones always do
    if "return_alphas" in inspect.signature(cls.lora_state_dict).parameters:
        kwargs["return_alphas"] = True
    try:
        out = cls.lora_state_dict(str(folder), **kwargs)
    except Exception as e:  # diffusers / safetensors say what is wrong with the file
        raise InvalidRequestError(field, f"cannot read a LoRA from {str(p)!r}: {type(e).__name__}: {e}") from None
    if not isinstance(out, tuple):
        out = (out,)
    state_dict = out[0]
    alphas = out[1] if len(out) == 3 else {}
    metadata = out[-1] if len(out) >= 2 else None
    return dict(state_dict), {k: float(v) for k, v in (alphas or {}).items()}, metadata


_KEY = re.compile(r"^(?P<module>.+?)\.(?P<part>lora_A\.weight|lora_B\.weight|alpha)$")


def _group(
    state_dict: Mapping[str, torch.Tensor], alphas: Mapping[str, float], field: str
) -> dict[tuple[str, str], dict[str, Any]]:
    if any(".lora_down." in k or ".lora.down." in k for k in state_dict) and not any("lora_A" in k for k in state_dict):
        from diffusers.utils import convert_unet_state_dict_to_peft

        state_dict = convert_unet_state_dict_to_peft(dict(state_dict))
    groups: dict[tuple[str, str], dict[str, Any]] = collections.defaultdict(dict)
    for key, value in {**state_dict, **alphas}.items():
        if "lora_magnitude_vector" in key:
            raise InvalidRequestError(field, "DoRA adapters are not supported")
        if key.endswith("lora_B.bias"):
            raise InvalidRequestError(field, "LoRA layers with a bias are not supported")
        m = _KEY.match(key)
        if m is None or "." not in m["module"]:
            raise InvalidRequestError(field, f"unexpected key {key!r} (not a LoRA layer's lora_A / lora_B / alpha)")
        component, module = m["module"].split(".", 1)
        part = {"lora_A.weight": "down", "lora_B.weight": "up", "alpha": "alpha"}[m["part"]]
        groups[(component, module)][part] = float(value) if part == "alpha" else value.float()
    return {k: g for k, g in groups.items() if "down" in g or "up" in g}


def _linear(model: nn.Module, component: str, module: str, field: str) -> nn.Linear:
    try:
        layer = model.get_submodule(module)
    except AttributeError:
        raise InvalidRequestError(
            field, f"layer {component}.{module} does not exist in this model (an adapter for another base model?)"
        ) from None
    if type(layer) is not nn.Linear:
        raise InvalidRequestError(
            field,
            f"layer {component}.{module} is a {type(layer).__name__}; only nn.Linear layers take per-request LoRA",
        )
    return layer


def _component_metadata(metadata: Mapping[str, Any] | None, component: str) -> dict[str, Any] | None:
    """diffusers saves the LoRA config per component (``transformer.lora_alpha``, ...)."""
    if not metadata:
        return None
    prefix = f"{component}."
    own = {k[len(prefix) :]: v for k, v in metadata.items() if k.startswith(prefix)}
    return own or None


def _pattern(patterns: Mapping[str, Any], module: str) -> Any:
    """PEFT's ``get_pattern_key``: the first pattern that matches the module path's end."""
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return None


def _scaling(
    module: str, rank: int, alpha: float | None, common_alpha: float | None, meta: Mapping[str, Any] | None
) -> float:
    if meta is not None:
        r = _pattern(meta.get("rank_pattern") or {}, module) or meta.get("r", rank)
        a = _pattern(meta.get("alpha_pattern") or {}, module) or meta.get("lora_alpha", r)
        if r != rank:
            raise InvalidRequestError(
                FIELD, f"layer {module}: the file's metadata says rank {r}, its weights have rank {rank}"
            )
        return float(a) / (math.sqrt(r) if meta.get("use_rslora") else r)
    if alpha is None:
        alpha = common_alpha if common_alpha is not None else rank
    return float(alpha) / rank


def _most_common(values: list[float]) -> float | None:
    return collections.Counter(values).most_common(1)[0][0] if values else None
