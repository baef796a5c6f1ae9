"""The sections a stage's entry in the deploy YAML nests (docs/configuration.md): ``parallel_config``,
``runtime``, ``placement``, ``replicas``, ``acceleration``, ``quantization``, ``lora_modules``.

Every model forbids unknown keys so that a typo fails at start-up with the
path of the offending key instead of being silently ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ParallelConfig(StrictModel):
    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    data_parallel_size: int = Field(1, ge=1)
    # Diffusion stages may shard one request over several devices (sequence/CFG parallel).
    world_size: int | None = Field(None, ge=1)
    # Diffusion: uncond and cond rows of CFG requests on different devices (stages/diffusion/parallel/)
    cfg_parallel_size: int | None = Field(None, ge=1, le=2)
    # Diffusion: the token sequence split over this many devices, heads exchanged around attention (Ulysses)
    ulysses_degree: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _diffusion_degrees(self) -> ParallelConfig:
        if self.cfg_parallel_size is None and self.ulysses_degree is None:
            return self
        if self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size > 1:
            raise ValueError(
                "cfg_parallel_size / ulysses_degree (diffusion) do not combine with tensor_parallel_size, "
                "pipeline_parallel_size or data_parallel_size"
            )
        product = (self.cfg_parallel_size or 1) * (self.ulysses_degree or 1)
        if self.world_size is not None and self.world_size != product:
            raise ValueError(
                f"cfg_parallel_size ({self.cfg_parallel_size or 1}) x ulysses_degree "
                f"({self.ulysses_degree or 1}) = {product} does not equal world_size ({self.world_size})"
            )
        return self

    @property
    def devices_per_replica(self) -> int:
        if self.cfg_parallel_size is not None or self.ulysses_degree is not None:
            return (self.cfg_parallel_size or 1) * (self.ulysses_degree or 1)
        return self.world_size or self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size

    def diffusion_degrees(self) -> tuple[int, int]:
        """(cfg_parallel_size, ulysses_degree) of a diffusion replica: with neither given, every device
        takes part in sequence parallelism (it speeds up every request; CFG parallelism only CFG ones)."""
        if self.cfg_parallel_size is None and self.ulysses_degree is None:
            return 1, self.devices_per_replica
        return self.cfg_parallel_size or 1, self.ulysses_degree or 1


class RuntimeConfig(StrictModel):
    devices: str | list[int | str] | None = None
    num_replicas: int | None = Field(None, ge=1)
    process: Literal["inline", "mp", "ray"] | None = None
    num_gpus: float | None = Field(None, ge=0)
    num_cpus: float | None = Field(None, ge=0)


class PlacementConfig(StrictModel):
    """Where a Ray stage's replicas may run, in Ray's own terms (docs/distributed.md): the actor's
    ``label_selector`` (node labels, e.g. ``{pool: dit}``; values may be ``!v``, ``in(a,b)``, ``!in(a,b)``)
    and custom ``resources`` each replica takes (e.g. ``{dit_slot: 1}``). Unset: anywhere."""

    label_selector: dict[str, str] = Field(default_factory=dict)
    resources: dict[str, float] = Field(default_factory=dict)

    @field_validator("resources")
    @classmethod
    def _amounts(cls, v: dict[str, float]) -> dict[str, float]:
        bad = sorted(k for k, n in v.items() if n <= 0)
        if bad:
            raise ValueError(f"resources.{bad[0]}: expected an amount > 0")
        return v


class ReplicaScalingConfig(StrictModel):
    """``replicas:`` of a Ray stage (docs/distributed.md): between ``min`` and ``max`` replicas, as many as its
    requests in flight need at ``target_queue_per_replica`` each. It starts with ``min``; one more is started as
    soon as the load asks for it, one less only after the load asked for fewer for ``scale_down_delay_s``
    without a break (a burst's gaps do not stop and restart replicas)."""

    min: int = Field(1, ge=1)
    max: int = Field(ge=1)
    target_queue_per_replica: float = Field(1.0, gt=0)
    scale_down_delay_s: float = Field(30.0, ge=0)

    @model_validator(mode="after")
    def _bounds(self) -> ReplicaScalingConfig:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min})")
        return self


class CacheConfig(StrictModel):
    """Per-request step caching of a diffusion stage (stages/diffusion/step_cache.py has the rules)."""

    method: Literal["first_block", "teacache"]
    # first_block: relative change of the first block's residual; teacache: accumulated relative change
    # of the first block's modulated input, at which a request computes again
    threshold: float = Field(gt=0)
    warmup_steps: int = Field(0, ge=0)  # the first steps always compute
    max_consecutive_cached: int | None = Field(None, ge=1)  # then one computed step
    coefficients: list[float] | None = None  # teacache only: numpy poly1d rescaling rel (default: identity)

    @model_validator(mode="after")
    def _coefficients(self) -> CacheConfig:
        if self.coefficients is not None:
            if self.method != "teacache":
                raise ValueError("coefficients: only the teacache method takes them")
            if not self.coefficients:
                raise ValueError("coefficients: empty list")
        return self


class AccelerationConfig(StrictModel):
    """``acceleration:`` of a diffusion stage; everything off by default."""

    cache: CacheConfig | None = None
    compile: bool = False  # torch.compile of the denoiser's blocks, dynamic shapes
    offload: Literal["none", "model", "layer"] = "none"  # CPU offload: whole components / block by block
    vae_tiling: bool = False  # diffusers' tiled VAE decode (and encode)


class QuantizationConfig(StrictModel):
    """``quantization:`` of a diffusion stage, in the names of diffusers' ``PipelineQuantizationConfig``
    (docs/quantization.md has the methods and what each was measured to cost)."""

    quant_backend: str = Field(min_length=1)  # torchao, gguf, quanto, bitsandbytes_4bit, bitsandbytes_8bit
    quant_kwargs: dict[str, Any] = Field(default_factory=dict)  # torchao: quant_type (a config class or short name)
    components_to_quantize: list[str] = Field(default_factory=lambda: ["transformer"], min_length=1)
    single_file: str | None = None  # gguf: the one component's weights in one file beside the diffusers folder


class LoraModuleConfig(StrictModel):
    """One LoRA adapter a stage loads at start (vLLM's ``--lora-modules``): ``name=path`` or this object."""

    name: str = Field(min_length=1)
    path: str = Field(min_length=1)
    base_model_name: str | None = None  # vLLM's field; listed as the adapter's parent when set
