"""Request parameters for diffusion stages (llm stages use vLLM's own SamplingParams)."""

from __future__ import annotations

import logging
from typing import Any, Mapping

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

logger = logging.getLogger(__name__)


class DiffusionSamplingParams(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, validate_assignment=True)

    height: int | None = Field(None, ge=1)
    width: int | None = Field(None, ge=1)
    num_inference_steps: int = Field(28, ge=1)
    guidance_scale: float = Field(7.0, ge=0)
    true_cfg_scale: float | None = Field(None, ge=0)
    guidance_scale_2: float | None = Field(None, ge=0)
    negative_prompt: str | None = None
    seed: int | None = None
    generator: torch.Generator | None = None
    num_outputs_per_prompt: int = Field(1, ge=1)
    strength: float | None = Field(None, gt=0, le=1)
    num_frames: int | None = Field(None, ge=1)
    fps: int | None = Field(None, ge=1)
    output_type: str = "pil"  # pil | np | latent
    max_sequence_length: int | None = Field(None, ge=1)
    extra_args: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def from_any(cls, value: "DiffusionSamplingParams | Mapping[str, Any] | None", defaults: Mapping[str, Any] | None = None) -> "DiffusionSamplingParams":
        """Build from an object, a partial dict merged over ``defaults``, or None (= defaults).

        Raises ``ValueError`` naming the offending field.
        """
        if isinstance(value, cls):
            return value
        merged = {**(defaults or {}), **(dict(value) if value else {})}
        try:
            return cls.model_validate(merged)
        except ValidationError as e:
            raise ValueError(_describe(e)) from None

    def filter_extra_args(self, allowed: Mapping[str, type]) -> "DiffusionSamplingParams":
        """Keep only the model family's declared extra_body_params; warn naming the rest."""
        dropped = sorted(k for k in self.extra_args if k not in allowed)
        if dropped:
            logger.warning("dropping extra_args not declared by this model family: %s", ", ".join(dropped))
        kept = {}
        for k, v in self.extra_args.items():
            if k in allowed:
                typ = allowed[k]
                try:
                    kept[k] = v if isinstance(v, typ) or typ is object else typ(v)
                except (TypeError, ValueError):
                    raise ValueError(f"extra_args.{k}: expected {typ.__name__}, got {v!r}") from None
        return self.model_copy(update={"extra_args": kept})


def _describe(e: ValidationError) -> str:
    parts = []
    for item in e.errors():
        field = ".".join(str(p) for p in item["loc"]) or "<params>"
        msg = "unknown parameter" if item["type"] == "extra_forbidden" else item["msg"]
        parts.append(f"{field}: {msg}")
    return "invalid sampling params: " + "; ".join(parts)
