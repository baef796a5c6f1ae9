"""The LoRA adapters a served pipeline holds, by name: what ``/v1/models`` lists, what ``model`` selects,
and what ``/v1/load_lora_adapter`` / ``/v1/unload_lora_adapter`` change.

Adapters live in the pipeline's LoRA stages (``params.lora_stages``: the diffusion stages, else the llm
stages), each replica holding its own copy: diffusion stages apply them per row inside shared forwards
(stages/diffusion/lora.py), llm stages hand them to vLLM. Adapters given at start (``--lora-modules``,
``lora_modules`` in a stage's deploy entry) are loaded by the stages themselves as they start;
runtime loads and unloads go to every replica of every LoRA stage, which needs stages running in this
process (``process: inline``, the default).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omnistage.errors import InvalidRequestError
from omnistage.params import lora_stages


@dataclass(frozen=True)
class LoraModule:
    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_modules(values: Sequence[str]) -> list[dict[str, Any]]:
    """vLLM's ``--lora-modules`` values: ``name=path`` or a JSON object ``{"name", "path",
    "base_model_name"}``, as deploy ``lora_modules`` entries. Raises ``ValueError`` naming the bad one."""
    out = []
    for item in values:
        if not item:
            continue
        if "=" in item and "," not in item and not item.lstrip().startswith("{"):
            name, path = item.split("=", 1)
            out.append({"name": name, "path": path})
            continue
        try:
            entry = json.loads(item)
        except json.JSONDecodeError:
            raise ValueError(f"--lora-modules: {item!r} is neither name=path nor a JSON object") from None
        if (
            not isinstance(entry, dict)
            or set(entry) - {"name", "path", "base_model_name"}
            or not {"name", "path"} <= set(entry)
        ):
            raise ValueError(f"--lora-modules: {item!r} needs exactly name, path and optionally base_model_name")
        out.append(entry)
    return out


def cli_overrides(
    pipeline: Any,
    *,
    lora_modules: list[dict[str, Any]] | None = None,
    enable_lora: bool = False,
    max_loras: int | None = None,
    max_lora_rank: int | None = None,
) -> dict[int, dict[str, Any]]:
    """The ``serve`` flags as stage overrides of the pipeline's LoRA stages (``{}`` when none is set)."""
    fields: dict[str, Any] = {}
    if lora_modules:
        fields["lora_modules"] = lora_modules
    if enable_lora:
        fields["enable_lora"] = True
    if max_loras is not None:
        fields["max_loras"] = max_loras
    if max_lora_rank is not None:
        fields["max_lora_rank"] = max_lora_rank
    if not fields:
        return {}
    stages = lora_stages(pipeline)
    if not stages:
        raise ValueError(
            f"--lora-modules: pipeline {pipeline.name!r} has no diffusion or llm stage to take LoRA adapters"
        )
    return {sid: dict(fields) for sid in stages}


class LoraAdapters:
    """The adapters an ``AsyncOmni`` serves (built before it starts, from its deploy config)."""

    def __init__(self, engine: Any):
        self.engine = engine
        pipeline, deploy = engine.pipeline, engine.deploy
        candidates = set(lora_stages(pipeline))
        self.stage_ids: list[int] = []
        self._modules: dict[str, LoraModule] = {}
        for sd in deploy.stages:
            if not sd.lora_enabled:
                continue
            if sd.stage_id not in candidates:
                raise ValueError(
                    f"stages[{sd.stage_id}].lora_modules: requests select adapters on stage(s) "
                    f"{sorted(candidates)} of pipeline {pipeline.name!r}; put LoRA settings there"
                )
            self.stage_ids.append(sd.stage_id)
            for m in sd.lora_modules:
                known = self._modules.get(m.name)
                if known is not None and known.path != m.path:
                    raise ValueError(
                        f"stages[{sd.stage_id}].lora_modules: {m.name!r} names another path on "
                        f"another stage ({known.path})"
                    )
                self._modules[m.name] = LoraModule(m.name, m.path, m.base_model_name)
        self._lock = asyncio.Lock()

    @property
    def enabled(self) -> bool:
        return bool(self.stage_ids)

    def runtime_updates_possible(self) -> str | None:
        """Why runtime loads cannot work with this deploy (None: they can)."""
        if not self.enabled:
            return (
                "no stage takes LoRA adapters; enable them on the pipeline's LoRA stage(s) "
                f"{lora_stages(self.engine.pipeline)} (enable_lora / --enable-lora)"
            )
        for sid in self.stage_ids:
            mode = self.engine.deploy.stage_process(sid)
            if mode not in (None, "inline"):
                return f"stage {sid} runs in process mode {mode!r}; runtime LoRA updates need 'inline'"
        return None

    def get(self, name: str | None) -> LoraModule | None:
        return self._modules.get(name) if name else None

    def modules(self) -> list[LoraModule]:
        return list(self._modules.values())

    async def load(self, name: str, path: str) -> LoraModule:
        """Into every replica of every LoRA stage; a failure leaves none of them holding it."""
        async with self._lock:
            if name in self._modules:
                raise InvalidRequestError("lora_name", f"the LoRA adapter {name!r} has already been loaded")
            done: list[Any] = []
            try:
                for engine in self._replicas():
                    await engine.load_lora(name, path)
                    done.append(engine)
            except BaseException:
                for engine in done:
                    await engine.unload_lora(name)
                raise
            module = self._modules[name] = LoraModule(name, path)
            return module

    async def unload(self, name: str) -> None:
        """The name stops resolving at once; requests already running with the adapter finish with it."""
        async with self._lock:
            if self._modules.pop(name, None) is None:
                raise KeyError(name)
            for engine in self._replicas():
                await engine.unload_lora(name)

    def _replicas(self) -> list[Any]:
        out = []
        for sid in self.stage_ids:
            for engine in self.engine.replicas(sid):
                if not hasattr(engine, "load_lora"):
                    raise InvalidRequestError(
                        "lora_name", f"stage {sid}'s engine ({type(engine).__name__}) cannot load adapters at runtime"
                    )
                out.append(engine)
        return out
