"""AsyncOmni: the asyncio entry point (offline scripts and the HTTP server)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from omnistage.config.schema import DeployConfig
from omnistage.engine.builder import resolve_deploy, start_orchestrator
from omnistage.engine.duplex import DuplexSession
from omnistage.engine.orchestrator import Orchestrator
from omnistage.engine.request import (
    OmniRequest,
    new_request_id,
    normalize_prompt,
    parse_modalities,
)
from omnistage.modality import OutputModality
from omnistage.outputs import OmniRequestOutput
from omnistage.params import RequestKnobs, stage_params
from omnistage.pipeline import Pipeline, resolve_pipeline
from omnistage.stages.base import StageEngine, StageStats

logger = logging.getLogger(__name__)


class AsyncOmni:
    """Serve one pipeline: ``async with AsyncOmni(model=...) as engine: ...``.

    ``engine_kwargs`` are stage deploy fields applied to every stage (the CLI
    layer of the configuration, e.g. ``max_num_seqs=4``).
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        pipeline: str | Pipeline | None = None,
        deploy_config: str | Path | Mapping[str, Any] | None = None,
        stage_overrides: str | Mapping[Any, Any] | None = None,
        platform: str | None = None,
        **engine_kwargs: Any,
    ):
        self.model = str(model) if model is not None else None
        if isinstance(pipeline, Pipeline):
            self.pipeline = pipeline
        else:
            self.pipeline = resolve_pipeline(self.model, pipeline or _pipeline_name(deploy_config))
        if self.model is None:
            self.model = self.pipeline.info.default_model
        self.pipeline = self.pipeline.for_model(self.model)  # e.g. the folder's voices
        # Validated now, before anything starts: a bad config never half-starts a server.
        self.deploy: DeployConfig = resolve_deploy(
            self.pipeline, deploy_config, stage_overrides, cli=engine_kwargs or None, platform=platform
        )
        self._orch: Orchestrator | None = None
        self._start_lock = asyncio.Lock()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> AsyncOmni:
        async with self._start_lock:
            if self._orch is None:
                self._orch = await start_orchestrator(self.pipeline, self.deploy, self.model)
        return self

    async def __aenter__(self) -> AsyncOmni:
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.shutdown()

    async def shutdown(self) -> None:
        orch, self._orch = self._orch, None
        if orch is None:
            return
        for rid in orch.running_requests():
            await orch.abort(rid)
        await asyncio.gather(*(c.shutdown() for c in orch.clients.values()), return_exceptions=True)

    @property
    def is_ready(self) -> bool:
        return self._orch is not None and all(s.healthy for s in self.stage_stats().values())

    # ------------------------------------------------------------------ info

    @property
    def default_sampling_params_list(self) -> list[dict[str, Any]]:
        return [
            dict(self.deploy.stage(s.stage_id).default_sampling_params if self.deploy.stage(s.stage_id) else {})
            for s in self.pipeline.stages
        ]

    @property
    def output_modalities(self) -> OutputModality:
        out = OutputModality(0)
        for t in self.final_output_types():
            out |= t
        return out

    def final_output_types(self) -> list[OutputModality]:
        """What each final stage produces (e.g. ``video|audio`` for one stage that makes both)."""
        if self._orch is not None:
            return [self._orch.output_types[s.stage_id] for s in self.pipeline.stages if s.final]
        return [
            OutputModality.parse((sd.engine_output_type if sd else None) or s.output)
            for s in self.pipeline.stages
            if s.final
            for sd in [self.deploy.stage(s.stage_id)]
        ]

    def stage_stats(self) -> dict[int, StageStats]:
        if self._orch is None:
            return {}
        return {sid: c.stats() for sid, c in self._orch.clients.items()}

    def replicas(self, stage_id: int) -> list[StageEngine]:
        """The running engines of one stage (one per replica), for inspection."""
        if self._orch is None:
            raise RuntimeError("the engine is not started")
        return list(self._orch.clients[stage_id].replicas)

    def running_requests(self, stage_id: int | None = None) -> list[str]:
        """Requests in flight: in the whole pipeline, or held by one stage."""
        if self._orch is None:
            return []
        if stage_id is None:
            return self._orch.running_requests()
        return self._orch.clients[stage_id].held()

    @property
    def started(self) -> bool:
        return self._orch is not None

    # ------------------------------------------------------------------ requests

    def make_request(
        self,
        prompt: str | Mapping[str, Any],
        request_id: str | None = None,
        sampling_params_list: Sequence[Any] | None = None,
        output_modalities: Sequence[str] | str | None = None,
        knobs: RequestKnobs | None = None,
        warnings: list[str] | None = None,
    ) -> OmniRequest:
        """Parse one request: prompt normalised, every stage's params merged and typed once
        (``knobs`` are an HTTP body's standard and model-specific keys, see ``omnistage.params``).
        Raises ``InvalidRequestError`` naming the field. With ``warnings`` (the server's requests) what is
        ignored is collected there (and in the request's ``warnings``) instead of refused."""
        prompt = normalize_prompt(prompt)
        modalities = parse_modalities(output_modalities if output_modalities is not None else prompt.get("modalities"))
        prompt.pop("modalities", None)
        params = stage_params(
            self.pipeline, self.default_sampling_params_list, knobs, sampling_params_list, prompt, warnings
        )
        req = OmniRequest(request_id or new_request_id(), prompt, params, modalities)
        req.warnings = warnings if warnings is not None else []
        return req

    async def generate(
        self,
        prompt: str | Mapping[str, Any],
        request_id: str | None = None,
        sampling_params_list: Sequence[Any] | None = None,
        output_modalities: Sequence[str] | str | None = None,
        knobs: RequestKnobs | None = None,
        session_id: str | None = None,
    ) -> AsyncIterator[OmniRequestOutput]:
        """Stream one request's updates; each final stage's last one has ``finished=True``. Requests naming the
        same ``session_id`` (a conversation's turns) are served by the same replica of every stage."""
        request = self.make_request(prompt, request_id, sampling_params_list, output_modalities, knobs)
        request.session_id = session_id
        async for out in self.run(request):
            yield out

    async def run(self, request: OmniRequest) -> AsyncIterator[OmniRequestOutput]:
        """Stream the updates of a request made by ``make_request``."""
        await self.start()
        async for out in self._orch.generate(request):
            yield out

    async def abort(self, request_id: str) -> None:
        if self._orch is not None:
            await self._orch.abort(request_id)

    async def open_duplex(
        self, sampling_params: Mapping[str, Any] | None = None, session_id: str | None = None
    ) -> DuplexSession:
        """A full-duplex session on a duplex pipeline (``PipelineInfo.duplex``): send audio, receive frames
        (``omnistage.engine.duplex``)."""
        if not self.pipeline.info.duplex:
            raise ValueError(f"pipeline {self.pipeline.name!r} has no duplex sessions")
        await self.start()
        return await DuplexSession(
            self._orch.clients[self.pipeline.stages[0].stage_id], sampling_params, session_id
        ).start()

    def end_session(self, session_id: str) -> None:
        """The conversation is over: its replicas are no longer kept for it."""
        if self._orch is not None:
            for client in self._orch.clients.values():
                client.end_session(session_id)


def _pipeline_name(deploy_config: Any) -> str | None:
    """A deploy config may force the pipeline (``pipeline: glm_image``)."""
    if deploy_config is None:
        return None
    from omnistage.config.loader import load_deploy_config

    return load_deploy_config(deploy_config).pipeline
