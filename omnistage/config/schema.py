"""Pydantic models for the deploy YAML (docs/configuration.md): the file, its ``server:`` and its stages (the
sections a stage nests are stage_sections.py's).

Every model forbids unknown keys so that a typo fails at start-up with the
path of the offending key instead of being silently ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from omnistage.config.stage_sections import (
    AccelerationConfig,
    LoraModuleConfig,
    ParallelConfig,
    PlacementConfig,
    QuantizationConfig,
    ReplicaScalingConfig,
    RuntimeConfig,
    StrictModel,
)
from omnistage.modality import OutputModality


def _device_list(devices: str | list[Any] | None) -> list[str] | None:
    if devices is None:
        return None
    items = devices.split(",") if isinstance(devices, str) else [str(d) for d in devices]
    items = [d.strip() for d in items]
    if any(d == "" for d in items):
        raise ValueError(f"devices {devices!r} has an empty entry")
    if len(set(items)) != len(items):
        raise ValueError(f"devices {devices!r} lists a device twice")
    return items


class ConnectorConfig(StrictModel):
    name: str
    extra: dict[str, Any] = Field(default_factory=dict)


def _lora_modules(value: Any) -> Any:
    """``"name=path"`` strings (vLLM's flag shape) become objects."""
    if not isinstance(value, list):
        return value
    out = []
    for item in value:
        if isinstance(item, str):
            name, sep, path = item.partition("=")
            if not sep:
                raise ValueError(f"lora_modules: expected 'name=path' or an object, got {item!r}")
            item = {"name": name.strip(), "path": path.strip()}
        out.append(item)
    return out


class StageDeployConfig(StrictModel):
    """Where and how big one stage runs. Unset fields fall back to the pipeline defaults."""

    stage_id: int = Field(ge=0)
    stage_type: Literal["llm", "diffusion", "ar", "generation"] | None = None  # checked against the pipeline
    model: str | None = None  # folder for this stage (defaults to the pipeline's model folder)
    model_stage: str | None = None  # legacy: name of the stage inside a multi-stage checkpoint
    devices: str | list[int | str] | None = None
    num_replicas: int = Field(1, ge=1)
    # Ray stages: a replica count that follows the load (the YAML key is ``replicas``; ``replicas`` below is the
    # count a stage starts with)
    autoscale: ReplicaScalingConfig | None = Field(None, alias="replicas")
    process: Literal["inline", "mp", "ray"] | None = None  # None: the engine kind's default
    runtime: RuntimeConfig | None = None
    placement: PlacementConfig | None = None  # Ray stages: which nodes may take the replicas
    parallel_config: ParallelConfig | None = None
    tensor_parallel_size: int | None = Field(None, ge=1)
    pipeline_parallel_size: int | None = Field(None, ge=1)
    max_num_seqs: int | None = Field(None, ge=1)
    max_model_len: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    kv_cache_memory_bytes: int | None = Field(None, ge=1)
    enforce_eager: bool | None = None
    enable_prefix_caching: bool | None = None
    trust_remote_code: bool | None = None
    dtype: str | None = None
    seed: int | None = None
    num_threads: int | None = Field(None, ge=1)  # torch/OMP threads for this stage's engine
    engine_output_type: str | None = None
    final_output: bool | None = None
    final_output_type: str | None = None
    default_sampling_params: dict[str, Any] = Field(default_factory=dict)
    engine_args: dict[str, Any] = Field(default_factory=dict)  # passed through to the engine (e.g. vLLM)
    connector: str | None = None  # name of a connector for this stage's outgoing edges
    # llm stages: media items per prompt and modality (vLLM's limit_mm_per_prompt), e.g. {"image": 2, "video": 0}
    limit_mm_per_prompt: dict[str, int | dict[str, Any]] | None = None
    acceleration: AccelerationConfig | None = None  # diffusion stages only
    # diffusion: a QuantizationConfig; llm: vLLM's method name (fp8, awq, gptq, gguf, ...), a pre-quantized
    # checkpoint's own config needs none
    quantization: str | QuantizationConfig | None = None
    # LoRA adapters (diffusion: per-request, per-row; llm: vLLM's own LoRA support)
    enable_lora: bool | None = None  # implied by lora_modules; needed for runtime loading without them
    lora_modules: list[LoraModuleConfig] = Field(default_factory=list)
    max_loras: int | None = Field(None, ge=1)  # adapters resident at once (vLLM: in one batch)
    max_lora_rank: int | None = Field(None, ge=1)

    @field_validator("engine_output_type", "final_output_type")
    @classmethod
    def _modality(cls, v: str | None) -> str | None:
        if v is not None:
            OutputModality.parse(v)
        return v

    @field_validator("lora_modules", mode="before")
    @classmethod
    def _lora_strings(cls, v: Any) -> Any:
        return _lora_modules(v)

    @field_validator("lora_modules")
    @classmethod
    def _lora_names(cls, v: list[LoraModuleConfig]) -> list[LoraModuleConfig]:
        names = [m.name for m in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"lora_modules: the name {dup[0]!r} is given twice")
        return v

    @property
    def lora_enabled(self) -> bool:
        return bool(self.enable_lora or self.lora_modules)

    @field_validator("limit_mm_per_prompt")
    @classmethod
    def _mm_limits(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        for modality, limit in (v or {}).items():
            count = limit.get("count") if isinstance(limit, dict) else limit
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValueError(
                    f'limit_mm_per_prompt.{modality}: expected a count >= 0 (or {{"count": N, ...}}), got {limit!r}'
                )
        return v

    @model_validator(mode="after")
    def _placement(self) -> StageDeployConfig:
        rt = self.runtime
        if rt is not None:
            if rt.devices is not None and self.devices is not None:
                raise ValueError("devices given both at stage level and under runtime")
            if rt.num_replicas is not None and "num_replicas" in self.model_fields_set:
                raise ValueError("num_replicas given both at stage level and under runtime")
        if self.autoscale is not None:
            if "num_replicas" in self.model_fields_set or (rt is not None and rt.num_replicas is not None):
                raise ValueError("replicas: a stage takes num_replicas (a fixed count) or replicas (min/max), not both")
            if self.device_list is not None:
                raise ValueError("replicas: a stage whose replica count follows the load takes no devices list")
        pc, tp = self.parallel_config, self.tensor_parallel_size
        if (
            pc is not None
            and tp is not None
            and "tensor_parallel_size" in pc.model_fields_set
            and pc.tensor_parallel_size != tp
        ):
            raise ValueError("tensor_parallel_size differs between stage level and parallel_config")
        if (
            pc is not None
            and (pc.cfg_parallel_size or pc.ulysses_degree)
            and ((tp or 1) > 1 or (self.pipeline_parallel_size or 1) > 1 or self.stage_type not in (None, "diffusion"))
        ):
            raise ValueError(
                "parallel_config.cfg_parallel_size / ulysses_degree: diffusion stages only, and not with "
                "tensor_parallel_size or pipeline_parallel_size"
            )
        if self.acceleration is not None and self.stage_type not in (None, "diffusion"):
            raise ValueError(f"acceleration: only diffusion stages take it (stage_type is {self.stage_type!r})")
        devices = self.device_list
        if devices is not None and len(devices) != self.replicas * self.devices_per_replica:
            raise ValueError(
                f"devices {devices} has {len(devices)} entries; expected num_replicas ({self.replicas}) "
                f"x devices_per_replica ({self.devices_per_replica}) = {self.replicas * self.devices_per_replica}"
            )
        return self

    # ---- resolved views (both placements accepted, one answer)
    @property
    def device_list(self) -> list[str] | None:
        raw = self.runtime.devices if self.runtime and self.runtime.devices is not None else self.devices
        return _device_list(raw)

    @property
    def replicas(self) -> int:
        """The replicas the stage starts with."""
        if self.autoscale is not None:
            return self.autoscale.min
        if self.runtime and self.runtime.num_replicas is not None:
            return self.runtime.num_replicas
        return self.num_replicas

    @property
    def process_mode(self) -> str | None:
        return self.runtime.process if self.runtime and self.runtime.process else self.process

    @property
    def tp_size(self) -> int:
        if self.tensor_parallel_size is not None:
            return self.tensor_parallel_size
        return self.parallel_config.tensor_parallel_size if self.parallel_config else 1

    @property
    def devices_per_replica(self) -> int:
        if self.parallel_config is not None:
            pc = self.parallel_config
            diffusion = pc.cfg_parallel_size is not None or pc.ulysses_degree is not None
            if self.tensor_parallel_size is not None and pc.world_size is None and not diffusion:
                return self.tensor_parallel_size * pc.pipeline_parallel_size * pc.data_parallel_size
            return pc.devices_per_replica
        return (self.tensor_parallel_size or 1) * (self.pipeline_parallel_size or 1)

    def replica_devices(self) -> list[list[str] | None]:
        """Contiguous chunks: replica 0 gets the first devices_per_replica devices, and so on."""
        devices, n = self.device_list, self.devices_per_replica
        if devices is None:
            return [None] * self.replicas
        return [devices[i * n : (i + 1) * n] for i in range(self.replicas)]


class StorageDeployConfig(StrictModel):
    """``server.storage:`` (``OMNISTAGE_SERVER_STORAGE__*``): the output folder and retention."""

    path: str | None = None
    file_concurrency: int | None = Field(None, ge=1)
    file_ttl: int | None = Field(None, ge=1)  # seconds an output is kept
    ttl_sweep_interval: int | None = Field(None, ge=1)


class ServerDeployConfig(StrictModel):
    """``server:`` of a deploy file: the settings ``omnistage serve`` also takes as ``OMNISTAGE_SERVER_*``
    variables (same names, lower case; config/settings.py) and, for the two stores, as flags. A flag wins over
    a variable, a variable over this (docs/fleet.md)."""

    job_store: str | None = None  # sqlite:///path or redis://host:port/db
    media_store: str | None = None  # file:///path or s3://bucket/prefix
    job_lease_s: float | None = Field(None, gt=0)
    job_max_attempts: int | None = Field(None, ge=1)
    presign_s: int | None = Field(None, ge=1)  # redirect downloads to a URL presigned this long (s3)
    storage: StorageDeployConfig | None = None


class DeployConfig(StrictModel):
    pipeline: str | None = None
    server: ServerDeployConfig | None = None  # omnistage serve only: where async jobs and outputs live
    async_chunk: bool | None = None  # None: the pipeline's default
    distributed_executor_backend: Literal["mp", "ray"] = "mp"
    connectors: dict[str, ConnectorConfig] = Field(default_factory=dict)
    stages: list[StageDeployConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique_ids(self) -> DeployConfig:
        ids = [s.stage_id for s in self.stages]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"stage_id {dup[0]} appears more than once in stages")
        for s in self.stages:
            if s.connector is not None and s.connector not in self.connectors:
                raise ValueError(
                    f"stage {s.stage_id} uses connector {s.connector!r}, which is not declared under connectors"
                )
            if s.placement is not None and self.stage_process(s.stage_id) != "ray":
                raise ValueError(
                    f"stage {s.stage_id}: placement applies to Ray stages only "
                    "(distributed_executor_backend: ray, or process: ray)"
                )
            if s.autoscale is not None and self.stage_process(s.stage_id) != "ray":
                raise ValueError(
                    f"stage {s.stage_id}: replicas (min/max) applies to Ray stages only "
                    "(distributed_executor_backend: ray, or process: ray)"
                )
        return self

    def stage(self, stage_id: int) -> StageDeployConfig | None:
        return next((s for s in self.stages if s.stage_id == stage_id), None)

    def stage_process(self, stage_id: int) -> str | None:
        """Where the stage runs: its own ``process`` if set, else a Ray actor under the ``ray`` backend, else
        None (the engine kind's default, inline). Family deploy files leave ``process`` unset so the backend
        flag reaches their stages."""
        sd = self.stage(stage_id)
        own = sd.process_mode if sd else None
        return own or ("ray" if self.distributed_executor_backend == "ray" else None)
