"""Start-up: resolve every stage's deploy config against the pipeline, check
it, and start the stage engines. Nothing is started until the whole
configuration is valid; if a stage fails to start, the ones already started
are shut down (no orphan processes)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from omnistage.config.loader import ConfigError, load_deploy_config
from omnistage.config.schema import DeployConfig, StageDeployConfig
from omnistage.engine.orchestrator import Orchestrator
from omnistage.engine.replica_scaler import ReplicaScaler
from omnistage.engine.stage_client import StageClient
from omnistage.engine.stage_factory import build_engine
from omnistage.errors import InvalidRequestError
from omnistage.llm_params import LLMSamplingParams
from omnistage.modality import OutputModality
from omnistage.params import DiffusionSamplingParams
from omnistage.pipeline import Pipeline, StageContext
from omnistage.stages.base import StageEngine
from omnistage.transport.codec import DEFAULT_SHM_THRESHOLD

logger = logging.getLogger(__name__)


def pipeline_deploy_defaults(pipeline: Pipeline) -> dict[str, Any]:
    """The pipeline's declaration expressed as the lowest deploy-config layer."""
    stages = []
    for s in pipeline.stages:
        stages.append(
            {
                **s.deploy_defaults,
                "stage_id": s.stage_id,
                "engine_output_type": s.output,
                "final_output": s.final,
                "default_sampling_params": dict(s.default_params),
            }
        )
    return {**pipeline.default_deploy, "stages": stages}


def resolve_deploy(
    pipeline: Pipeline,
    deploy_config: Any = None,
    stage_overrides: Any = None,
    cli: Mapping[str, Any] | None = None,
    platform: str | None = None,
) -> DeployConfig:
    defaults = pipeline_deploy_defaults(pipeline)
    if pipeline.deploy_file is not None:  # the family's shipped deploy YAML: the lowest file layer
        defaults = load_deploy_config(pipeline.deploy_file, defaults=defaults, platform=platform).model_dump(
            exclude_unset=True,
            by_alias=True,  # a stage's ``replicas:`` (min/max) is the YAML key of ``autoscale``
        )
    deploy = load_deploy_config(deploy_config, stage_overrides, defaults=defaults, cli=cli, platform=platform)
    check_deploy(pipeline, deploy)
    return deploy


def check_deploy(pipeline: Pipeline, deploy: DeployConfig) -> None:
    if deploy.pipeline is not None and deploy.pipeline != pipeline.name:
        raise ConfigError(
            f"pipeline: deploy config is for {deploy.pipeline!r}, but the model resolves to {pipeline.name!r}"
        )
    ids = {s.stage_id for s in pipeline.stages}
    for sd in deploy.stages:
        if sd.stage_id not in ids:
            raise ConfigError(
                f"stages: stage_id {sd.stage_id} does not exist in pipeline {pipeline.name!r} (stages {sorted(ids)})"
            )
        spec = pipeline.stage(sd.stage_id)
        if sd.stage_type is not None and sd.stage_type != spec.kind:
            raise ConfigError(
                f"stages[{sd.stage_id}].stage_type: {sd.stage_type!r}, but the pipeline declares {spec.kind!r}"
            )
        if sd.acceleration is not None and spec.kind != "diffusion":
            raise ConfigError(
                f"stages[{sd.stage_id}].acceleration: only diffusion stages take it "
                f"(stage {sd.stage_id} is {spec.kind})"
            )
        if sd.quantization is not None:
            from omnistage.stages.diffusion.quantization import QuantizationError, check_stage

            try:
                check_stage(spec.kind, sd, f"stages[{sd.stage_id}].quantization")
            except QuantizationError as e:
                raise ConfigError(str(e)) from None
        if spec.kind == "diffusion" and sd.lora_enabled and isinstance(spec.adapter, type):
            reason = spec.adapter.unsupported("lora")
            if reason:
                raise ConfigError(
                    f"stages[{sd.stage_id}].lora_modules: pipeline {pipeline.name!r} does not support LoRA ({reason})"
                )
        if spec.kind == "diffusion":  # typed now, so a bad default fails at start-up, not on every request
            try:
                DiffusionSamplingParams.from_any(sd.default_sampling_params)
            except InvalidRequestError as e:
                raise ConfigError(f"stages[{sd.stage_id}].default_sampling_params.{e.field}: {e.message}") from None
        if spec.kind == "llm":  # the same: checked now as every request would check it
            try:
                LLMSamplingParams.from_any(
                    sd.default_sampling_params, f"stages[{sd.stage_id}].default_sampling_params."
                )
            except InvalidRequestError as e:
                raise ConfigError(f"{e.field}: {e.message}") from None
        produced = OutputModality.parse(sd.engine_output_type or spec.output)
        if produced & ~spec.producible:
            raise ConfigError(
                f"stages[{sd.stage_id}].engine_output_type: stage {sd.stage_id} ({spec.kind}) cannot produce "
                f"{produced & ~spec.producible}; it can produce {spec.producible}"
            )
    for name, conn in deploy.connectors.items():
        if conn.name not in CONNECTORS:
            raise ConfigError(
                f"connectors.{name}.name: unknown connector {conn.name!r}; known: {', '.join(CONNECTORS)}"
            )
        unknown = set(conn.extra) - ({"threshold_bytes"} if conn.name == "SharedMemoryConnector" else set())
        if unknown:
            raise ConfigError(f"connectors.{name}.extra: unknown key(s) {', '.join(sorted(unknown))}")
    if deploy.async_chunk and len(pipeline.stages) == 1:
        raise ConfigError("async_chunk: invalid for a one-stage pipeline (there is no downstream stage to stream to)")


CONNECTORS = ("SharedMemoryConnector", "InlineConnector")


def shm_threshold(deploy: DeployConfig, sd: StageDeployConfig) -> int | None:
    """Shared memory for large buffers of mp stages: on by default, tuned or turned off by a connector."""
    if sd.connector is None:
        return DEFAULT_SHM_THRESHOLD
    conn = deploy.connectors[sd.connector]
    if conn.name == "InlineConnector":
        return None
    return int(conn.extra.get("threshold_bytes", DEFAULT_SHM_THRESHOLD))


def stage_output_types(pipeline: Pipeline, deploy: DeployConfig) -> dict[int, OutputModality]:
    out = {}
    for s in pipeline.stages:
        sd = deploy.stage(s.stage_id)
        out[s.stage_id] = OutputModality.parse((sd.engine_output_type if sd else None) or s.output)
    return out


def _replica_context(
    pipeline: Pipeline, deploy: DeployConfig, sd: StageDeployConfig, model: str | None, idx: int, devices: Any
) -> StageContext:
    return StageContext(
        spec=pipeline.stage(sd.stage_id),
        deploy=sd,
        model=sd.model or model,
        replica=idx,
        devices=devices,
        pipeline_name=pipeline.name,
        shm_threshold=shm_threshold(deploy, sd),
    )


async def _start_replica(ctx: StageContext) -> StageEngine:
    """One more replica of a stage whose count follows the load: started, or shut down again."""
    engine = build_engine(ctx)
    try:
        await engine.start()
    except BaseException:
        await asyncio.shield(engine.shutdown())
        raise
    return engine


def _scaler(
    pipeline: Pipeline, deploy: DeployConfig, sd: StageDeployConfig, model: str | None, client: StageClient
) -> ReplicaScaler:
    async def start_replica(idx: int) -> StageEngine:
        return await _start_replica(_replica_context(pipeline, deploy, sd, model, idx, None))

    return ReplicaScaler(client, start_replica, sd.autoscale)


async def start_orchestrator(pipeline: Pipeline, deploy: DeployConfig, model: str | None) -> Orchestrator:
    clients: dict[int, StageClient] = {}
    started: list[StageEngine] = []
    try:
        for spec in pipeline.stages:
            sd = deploy.stage(spec.stage_id) or StageDeployConfig(stage_id=spec.stage_id)
            mode = deploy.stage_process(spec.stage_id)
            if mode != sd.process_mode:  # the ray backend reaches every stage that does not say where it runs
                sd = sd.model_copy(update={"process": mode})
            replicas = []
            for idx, devices in enumerate(sd.replica_devices()):
                engine = build_engine(_replica_context(pipeline, deploy, sd, model, idx, devices))
                started.append(engine)  # before start(): a half-started engine is shut down too
                await engine.start()
                replicas.append(engine)
            clients[spec.stage_id] = StageClient(spec, replicas)
            if sd.autoscale is not None:
                clients[spec.stage_id].scaler = _scaler(pipeline, deploy, sd, model, clients[spec.stage_id])
            logger.info("stage %d (%s) ready: %d replica(s)", spec.stage_id, spec.name, len(replicas))
    except BaseException:
        for engine in reversed(started):
            try:
                await engine.shutdown()
            except Exception:
                logger.exception("shutting down a stage after a failed start")
        raise
    for client in clients.values():  # once every stage is up: a failed start leaves no scaler running
        if client.scaler is not None:
            client.scaler.start()
    async_chunk = (
        deploy.async_chunk
        if deploy.async_chunk is not None
        else any(e.can_stream for s in pipeline.stages for e in s.inputs)
    )
    return Orchestrator(pipeline, deploy, clients, stage_output_types(pipeline, deploy), async_chunk)
