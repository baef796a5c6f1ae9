"""Typed pipeline declarations and the pipeline registry.

A model family declares its topology once, in Python, with real objects:

    PIPELINE = Pipeline(
        name="glm_image",
        matches=lambda folder: folder.diffusers_class == "GlmImagePipeline",
        stages=[StageSpec(0, kind="llm", output="token_ids"),
                StageSpec(1, kind="diffusion", adapter=GlmImageAdapter, output="image", final=True,
                          inputs=[Edge(0, process=ar_tokens_to_prior)])],
    )

A built-in family is one folder under ``omnistage/models/`` exporting
``PIPELINES`` (its declarations) and ``TINY`` (its tiny-fixture builders), and
one import line in ``omnistage/models/__init__.py``, which registers them here
(this module imports no family). Code outside omnistage adds pipelines with
``register_pipeline``. Deploy YAML only says where and how
big each stage runs. A stage's ``kind`` is the engine that runs it; its ``knobs``
which of a request's standard knobs reach it; the pipeline's ``info`` what the
server reads about the model (omnistage.info). docs/adding-a-family.md walks
through a new family.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from omnistage.info import PipelineInfo
from omnistage.modality import AccumulationRule, OutputModality

if TYPE_CHECKING:
    from omnistage.config.schema import StageDeployConfig
    from omnistage.stages.base import StageEngine
    from omnistage.stages.generation.adapter import GenerationAdapter

# The engine that runs a stage: vLLM (``llm``), the diffusion engine, the step-batched autoregressive engine
# (``ar``: omnistage.stages.ar, a family's StepEngine subclass given as ``engine``), or the batched one-shot /
# chunked engine (``generation``: codec decoders, vocoders).
StageKind = Literal["llm", "diffusion", "ar", "generation"]
STAGE_KINDS = ("llm", "diffusion", "ar", "generation")
# Which of a request's standard knobs (omnistage.params.RequestKnobs) reach a stage: the LLM sampling ones
# (``max_tokens``, ``temperature``, ``top_p``, ``seed``, ...), the diffusion ones (``size``, steps, guidance,
# ``seed``, ``n``, ...), or none (the stage reads only its own ``sampling_params_list`` entry).
StageKnobs = Literal["llm", "diffusion", "none"]
STAGE_KNOBS = ("llm", "diffusion", "none")
# (a generation stage's default is the pipeline's: see Pipeline.__post_init__)
_DEFAULT_KNOBS: dict[str, StageKnobs | None] = {
    "llm": "llm",
    "diffusion": "diffusion",
    "ar": "none",
    "generation": None,
}

# (source stage's accumulated outputs, the original request) -> downstream inputs
EdgeProcess = Callable[[dict[str, Any], "Any"], dict[str, Any]]
# (new upstream delta, request, per-request edge state) -> a chunk to feed, or None to wait
EdgeChunkProcess = Callable[[dict[str, Any], "Any", dict[str, Any]], "dict[str, Any] | None"]
# A generation stage's adapter: built from the stage's context (a class or a factory function)
GenerationAdapterFactory = Callable[["StageContext"], "GenerationAdapter"]
# Family-specific request shaping, before parameters are parsed: (prompt, per-stage merged param dicts)
RequestHook = Callable[[dict[str, Any], list[dict[str, Any]]], None]


@dataclass(frozen=True)
class Lazy:
    """A stage's engine or adapter factory named ``"module:attribute"`` and imported on its first call, so that a
    family's declaration imports no torch, transformers or vLLM (they load when a stage starts). ``kwargs`` are
    passed along with the stage context. Picklable: a stage in a child process gets it with its spec."""

    target: str
    kwargs: tuple[tuple[str, Any], ...] = ()

    def __call__(self, ctx: StageContext) -> Any:
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)(ctx, **dict(self.kwargs))


def lazy(target: str, **kwargs: Any) -> Lazy:
    """``lazy("omnistage.models.x.engine:build_engine")``: the factory ``build_engine(ctx)``, imported when called."""
    if ":" not in target:
        raise ValueError(f"lazy({target!r}): name the factory as 'module:attribute'")
    return Lazy(target, tuple(sorted(kwargs.items())))


@dataclass(frozen=True)
class Edge:
    """Data flows from stage ``source`` into the stage that lists this edge."""

    source: int
    process: EdgeProcess | None = None  # None: pass the source's outputs through unchanged
    # When set (and async chunk is on), the downstream starts early and is fed chunks.
    process_chunk: EdgeChunkProcess | None = None

    @property
    def can_stream(self) -> bool:
        return self.process_chunk is not None


def chunk_size(request: Any, stage_id: int, key: str, default: int) -> int:
    """A streaming edge's piece size: the positive int ``key`` of the request's params for ``stage_id`` (the
    stage the edge feeds), else ``default``. A bad value is the receiving stage's to report (it validates
    its params as a 400); the edge just streams with the default meanwhile."""
    params = request.sampling_params
    own = params[stage_id] if len(params) > stage_id and isinstance(params[stage_id], Mapping) else {}
    n = own.get(key, default)
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else default


@dataclass
class StageContext:
    """Everything needed to build one replica of a stage's engine (picklable for child processes)."""

    spec: StageSpec
    deploy: StageDeployConfig
    model: str | None
    replica: int = 0
    devices: list[str] | None = None
    pipeline_name: str = ""
    # mp stages: buffers of at least this many bytes cross processes via shared memory (None: never)
    shm_threshold: int | None = None


@dataclass
class StageSpec:
    stage_id: int
    kind: StageKind
    output: str = "text"  # default engine_output_type
    final: bool = False
    inputs: list[Edge] = field(default_factory=list)
    name: str = ""
    default_params: dict[str, Any] = field(default_factory=dict)  # default sampling params
    deploy_defaults: dict[str, Any] = field(default_factory=dict)  # default deploy fields
    # diffusion: a DiffusionAdapter subclass (omnistage.stages.diffusion.adapter: ``load(folder, dtype, device)``);
    # generation: a factory taking the StageContext; llm stages and custom engines take none
    adapter: type | GenerationAdapterFactory | None = None
    # Custom engine factory; None selects the generic engine of ``kind``.
    engine: Callable[[StageContext], StageEngine] | None = None
    # Output types this stage can produce (engine_output_type must be a subset); None = only ``output``.
    can_output: str | None = None
    model_subfolder: str | None = None  # the stage's part of the model folder
    accumulation: dict[str, AccumulationRule] = field(default_factory=dict)
    # The sampling param names this (non-vLLM) stage reads; a request's other vLLM SamplingParams names are then
    # dropped with a warning (omnistage.sampling_fields). None: not declared, the stage checks every name itself.
    param_keys: frozenset[str] | None = None
    # Which request knobs reach it (StageKnobs); None: its engine's (llm -> llm, diffusion -> diffusion, ar ->
    # none; a generation stage: diffusion when it is final in a pipeline with no diffusion stage, which it then
    # stands in for, else none). An AR speech stage that samples as an LLM does says "llm".
    knobs: StageKnobs | None = None

    def __post_init__(self) -> None:
        if self.kind not in STAGE_KINDS:
            raise ValueError(f"stage {self.stage_id}: kind {self.kind!r} is not one of {', '.join(STAGE_KINDS)}")
        self.knobs = self.knobs or _DEFAULT_KNOBS[self.kind]
        if self.knobs is not None and self.knobs not in STAGE_KNOBS:
            raise ValueError(f"stage {self.stage_id}: knobs {self.knobs!r} is not one of {', '.join(STAGE_KNOBS)}")
        if self.kind == "ar" and self.engine is None:
            raise ValueError(f"stage {self.stage_id}: an ar stage names its engine (a StepEngine subclass's factory)")
        OutputModality.parse(self.output)
        self.name = self.name or f"{self.kind}{self.stage_id}"
        if (
            self.kind == "diffusion"
            and self.adapter is not None
            # (a class with its ``load``: this module imports no engine, so that stage modules may import it)
            and not (isinstance(self.adapter, type) and callable(getattr(self.adapter, "load", None)))
        ):
            raise TypeError(
                f"stage {self.stage_id}: a diffusion stage's adapter must be a DiffusionAdapter subclass, "
                f"got {self.adapter!r}"
            )

    @property
    def output_modality(self) -> OutputModality:
        return OutputModality.parse(self.output)

    @property
    def producible(self) -> OutputModality:
        return OutputModality.parse(self.can_output) if self.can_output else self.output_modality


@dataclass(frozen=True)
class ModelFolder:
    """What pipeline resolution needs to know about a local model folder."""

    path: Path

    @cached_property
    def diffusers_class(self) -> str | None:
        return read_json(self.path / "model_index.json").get("_class_name")

    @cached_property
    def architectures(self) -> list[str]:
        return list(read_json(self.path / "config.json").get("architectures") or [])

    @cached_property
    def mistral_params(self) -> dict[str, Any]:
        """Mistral's own layout keeps its config in ``params.json`` (Voxtral: what vLLM reads of it)."""
        return read_json(self.path / "params.json")

    @cached_property
    def omnistage_pipeline(self) -> str | None:
        """A folder may name its pipeline explicitly in ``omnistage.json``."""
        return read_json(self.path / "omnistage.json").get("pipeline")

    def is_checkpoint_of(self, architectures: set[str]) -> bool:
        """A transformers checkpoint (not a diffusers or omnistage pipeline folder) of one of ``architectures``."""
        if self.diffusers_class is not None or self.omnistage_pipeline is not None:
            return False
        return bool(architectures & set(self.architectures))


def read_json(path: Path) -> dict[str, Any]:
    """A model folder's JSON file as a dict ({} when it is missing); invalid JSON is a ValueError naming it."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, NotADirectoryError):
        return {}
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None


@dataclass
class Pipeline:
    name: str
    stages: list[StageSpec]
    matches: Callable[[ModelFolder], bool] | None = None
    description: str = ""
    # Model-specific request knobs accepted in extra_args / extra_body (name -> type).
    extra_body_params: dict[str, type] = field(default_factory=dict)
    default_deploy: dict[str, Any] = field(default_factory=dict)  # e.g. {"async_chunk": True}
    # the family's shipped deploy YAML (models/<family>/deploy.yaml): loaded under the user's deploy config,
    # and a starting point to copy; sampling defaults stay declared here, beside the adapters that use them
    deploy_file: Path | None = None
    # What the server and the CLI read about the model (omnistage.info: chat or not, voices, recogniser setup).
    info: PipelineInfo = field(default_factory=PipelineInfo)
    # ``info`` completed from a model folder (e.g. the voices a checkpoint defines), read when a model is served.
    folder_info: Callable[[Path, PipelineInfo], PipelineInfo] | None = None
    # Per-folder additions to ``extra_body_params`` (e.g. those of the image family a folder wraps).
    folder_extra_body_params: Callable[[Path], dict[str, type]] | None = None
    # A per-folder ``shape_request`` (e.g. one that tokenizes with the folder's own tokenizer), set when served.
    folder_shape_request: Callable[[Path], RequestHook] | None = None
    # Called once per request before its parameters are parsed (e.g. GLM-Image tells its AR stage the size).
    shape_request: RequestHook | None = None

    def for_model(self, model: str | Path | None) -> Pipeline:
        """This pipeline completed from the model folder (itself when nothing to add)."""
        if model is None or (
            self.folder_info is None and self.folder_extra_body_params is None and self.folder_shape_request is None
        ):
            return self
        folder = Path(model)
        info = self.folder_info(folder, self.info) if self.folder_info else self.info
        extra = {
            **self.extra_body_params,
            **(self.folder_extra_body_params(folder) if self.folder_extra_body_params else {}),
        }
        hook = self.folder_shape_request(folder) if self.folder_shape_request else self.shape_request
        return replace(self, info=info, extra_body_params=extra, shape_request=hook)

    def __post_init__(self) -> None:
        if not isinstance(self.info, PipelineInfo):
            raise TypeError(f"pipeline {self.name!r}: info must be an omnistage.info.PipelineInfo, got {self.info!r}")
        ids = [s.stage_id for s in self.stages]
        if ids != list(range(len(ids))):
            raise ValueError(f"pipeline {self.name!r}: stage ids must be 0..{len(ids) - 1} in order, got {ids}")
        if not any(s.final for s in self.stages):
            raise ValueError(f"pipeline {self.name!r}: no stage is marked final")
        denoises = any(s.kind == "diffusion" for s in self.stages)
        for s in self.stages:
            if s.knobs is None:  # a generation stage that did not say
                s.knobs = "diffusion" if s.final and not denoises else "none"
        for s in self.stages:
            for e in s.inputs:
                if not 0 <= e.source < s.stage_id:
                    raise ValueError(
                        f"pipeline {self.name!r}: stage {s.stage_id} reads from stage {e.source}; "
                        "edges must point from an earlier stage (the graph is a DAG in id order)"
                    )

    def stage(self, stage_id: int) -> StageSpec:
        return self.stages[stage_id]

    def consumers(self, stage_id: int) -> list[StageSpec]:
        return [s for s in self.stages if any(e.source == stage_id for e in s.inputs)]

    @property
    def output_modalities(self) -> OutputModality:
        out = OutputModality(0)
        for s in self.stages:
            if s.final:
                out |= s.output_modality
        return out

    def describe(self) -> str:
        lines = [f"{self.name}: {self.description}".rstrip(": ")]
        for s in self.stages:
            src = ", ".join(str(e.source) for e in s.inputs) or "request"
            final = "  [final]" if s.final else ""
            lines.append(
                f"  stage {s.stage_id} {s.name:<14} kind={s.kind:<10} knobs={s.knobs:<9} output={s.output:<12} "
                f"from={src}{final}"
            )
        return "\n".join(lines)


# The registry imports no family: families import this module, and omnistage/models/__init__.py registers the
# built-in ones (``register_family``) when it is imported, so the dependency runs one way. Importing any family
# module imports that package first, so whoever holds one family's classes has every built-in one registered.
_BUILTIN: dict[str, Pipeline] = {}  # in registration order: the first match of a folder wins
_TINY: dict[str, Callable[[Path], None]] = {}
_REGISTRY: dict[str, Pipeline] = {}  # added from outside omnistage (register_pipeline)


def register_family(family: Any) -> None:
    """Add a built-in family: a module exporting ``PIPELINES`` (declarations) and ``TINY`` (tiny-fixture builders
    by name). omnistage/models/__init__.py calls this once per family, in matching order."""
    for p in family.PIPELINES:
        if _BUILTIN.get(p.name, p) is not p:
            raise ValueError(f"pipeline {p.name!r} is declared by two families")
        _BUILTIN[p.name] = p
    for name, build in family.TINY.items():
        if _TINY.get(name, build) is not build:
            raise ValueError(f"tiny model {name!r} is declared by two families")
        _TINY[name] = build


def register_pipeline(pipeline: Pipeline, *, replace: bool = False) -> Pipeline:
    """Add a pipeline from outside omnistage's own families (built-in ones are listed in omnistage.models)."""
    existing = registered_pipelines().get(pipeline.name)
    if existing is not None and existing is not pipeline and not replace:
        raise ValueError(f"pipeline {pipeline.name!r} is already registered")
    _REGISTRY[pipeline.name] = pipeline
    return pipeline


def registered_pipelines() -> dict[str, Pipeline]:
    """Every registered pipeline by name (the built-in ones once omnistage.models is imported)."""
    return {**_BUILTIN, **_REGISTRY}


def tiny_builders() -> dict[str, Callable[[Path], None]]:
    """The registered families' tiny-fixture builders by name."""
    return dict(_TINY)


def _not_loaded_hint() -> str:
    return "" if _BUILTIN else " (the built-in families are not loaded: import omnistage.models first)"


def get_pipeline(name: str) -> Pipeline:
    pipelines = registered_pipelines()
    if name not in pipelines:
        raise ValueError(
            f"unknown pipeline {name!r}; registered: {', '.join(sorted(pipelines)) or 'none'}{_not_loaded_hint()}"
        )
    return pipelines[name]


def resolve_pipeline(model: str | Path | None, name: str | None = None) -> Pipeline:
    """An explicit name wins; otherwise match the model folder's metadata."""
    if name:
        return get_pipeline(name)
    if model is None:  # the pipeline that ships weights of its own (the built-in demo) serves without a folder
        shipped = [p for p in registered_pipelines().values() if p.info.default_model]
        if not shipped:
            raise ValueError(f"no model folder given and no registered pipeline ships weights{_not_loaded_hint()}")
        return shipped[0]
    folder = ModelFolder(Path(model))
    if not folder.path.is_dir():
        raise ValueError(f"model {str(model)!r} is not a local folder (models load from local folders only)")
    if folder.omnistage_pipeline:
        return get_pipeline(folder.omnistage_pipeline)
    for pipeline in registered_pipelines().values():
        if pipeline.matches is not None and pipeline.matches(folder):
            return pipeline
    raise ValueError(
        f"no registered pipeline matches {str(model)!r} (model_index _class_name={folder.diffusers_class!r}, "
        f"architectures={folder.architectures}); pass a pipeline name{_not_loaded_hint()}"
    )
