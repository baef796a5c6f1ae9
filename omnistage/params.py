"""Request parameters: the one table of standard knobs and the one place they are parsed.

A request's knobs arrive once, at the edge of the system: an HTTP body (top
level or a literal ``extra_body``) or an offline call. ``stage_params`` turns
them into every stage's parameters in one pass:

- standard knobs (``RequestKnobs``) are routed by stage kind: diffusion keys to
  the stages that denoise, vLLM keys to llm stages;
- model-specific keys become ``extra_args`` of the denoising stage, filtered
  once against the pipeline's declared ``extra_body_params``;
- an explicit ``sampling_params_list`` entry wins over routed knobs, and the
  stage's deploy defaults are merged under both, once;
- diffusion stages get a typed ``DiffusionSamplingParams``, llm stages a typed
  ``LLMSamplingParams`` (omnistage.llm_params: vLLM's field names, the fields the
  layers set remembered; the llm stage turns it into vLLM's own ``SamplingParams``
  — it is the only place that imports vLLM); ar and generation stages get the
  merged dict.

Every value is checked here, before any stage runs, and a bad one is an
``InvalidRequestError`` naming the field (``sampling_params_list[i].<field>`` where
the caller gave it per stage), offline and over HTTP alike; what only a loaded
model can judge (token ids within its vocabulary) is the stage's.

Defaults resolve in one order: the family's stage defaults, then the deploy (YAML,
then ``--stage-overrides``), then the request; only fields a layer set count.

Engines take these as they are: they never merge defaults or filter extras again.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from omnistage.errors import InvalidRequestError
from omnistage.llm_params import MAX_SEED, LLMSamplingParams
from omnistage.sampling_fields import drop_unread

if TYPE_CHECKING:
    from omnistage.pipeline import Pipeline

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
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    generator: torch.Generator | None = None
    num_outputs_per_prompt: int = Field(1, ge=1)
    strength: float | None = Field(None, gt=0, le=1)
    num_frames: int | None = Field(None, ge=1)
    # num_frames is approximate (the server derived it from seconds x fps): the family takes the nearest count
    # it makes instead of refusing it
    nearest_frames: bool = False
    fps: int | None = Field(None, ge=1)
    output_type: str = "pil"  # pil | np | latent
    max_sequence_length: int | None = Field(None, ge=1)
    cache: bool = True  # False: this request never reuses cached steps (when the stage caches)
    lora: str | None = None  # the name of a LoRA adapter the stage holds (None: the base model)
    lora_scale: float = Field(1.0, allow_inf_nan=False)  # diffusers' LoRA ``scale`` (joint_attention_kwargs)
    extra_args: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def from_any(
        cls,
        value: DiffusionSamplingParams | Mapping[str, Any] | None,
        defaults: Mapping[str, Any] | None = None,
        where: str = "",
    ) -> DiffusionSamplingParams:
        """An object as it is; a partial dict merged over ``defaults``; None = the defaults.
        Raises ``InvalidRequestError`` naming the field (``where`` is put in front of its name)."""
        if isinstance(value, cls):
            return value
        merged = {**(defaults or {}), **(dict(value) if value else {})}
        try:
            return cls.model_validate(merged)
        except ValidationError as e:
            raise validation_error(e, where) from None


class RequestKnobs(BaseModel):
    """The standard generation keys of a request (docs/server.md), accepted at the top level of an HTTP body
    or in its ``extra_body``. Anything else is model-specific: it becomes ``extra_args``."""

    model_config = ConfigDict(extra="allow")

    # diffusion
    height: int | None = Field(None, ge=1, le=16384)
    width: int | None = Field(None, ge=1, le=16384)
    size: str | None = None
    num_inference_steps: int | None = Field(None, ge=1, le=1000)
    guidance_scale: float | None = Field(None, ge=0)
    guidance_scale_2: float | None = Field(None, ge=0)
    true_cfg_scale: float | None = Field(None, ge=0)
    negative_prompt: str | None = None
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    n: int | None = Field(None, ge=1)
    num_outputs_per_prompt: int | None = Field(None, ge=1)  # diffusers' spelling of n (vLLM-Omni's clients send it)
    strength: float | None = Field(None, gt=0, le=1)
    num_frames: int | None = Field(None, ge=1, le=10000)
    nearest_frames: bool | None = None  # true: num_frames is approximate; the family takes its nearest count
    fps: int | None = Field(None, ge=1, le=240)
    max_sequence_length: int | None = Field(None, ge=1)  # prompt tokens the text encoder keeps
    cache: bool | None = None  # false: opt out of the stage's step cache
    lora_scale: float | None = Field(None, allow_inf_nan=False)  # the adapter `model` names, at this scale
    # llm (vLLM SamplingParams)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = None
    min_p: float | None = Field(None, ge=0, le=1)
    min_tokens: int | None = Field(None, ge=0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0)
    ignore_eos: bool | None = None

    DIFFUSION: ClassVar[tuple[str, ...]] = (
        "height",
        "width",
        "num_inference_steps",
        "guidance_scale",
        "guidance_scale_2",
        "true_cfg_scale",
        "negative_prompt",
        "seed",
        "strength",
        "num_frames",
        "nearest_frames",
        "fps",
        "max_sequence_length",
        "cache",
    )
    LLM: ClassVar[tuple[str, ...]] = (
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "min_tokens",
        "seed",
        "stop",
        "stop_token_ids",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "ignore_eos",
    )
    # body fields of OpenAI's APIs that carry no generation meaning here (never model-specific extras)
    IGNORED: ClassVar[frozenset[str]] = frozenset()

    @field_validator("size")
    @classmethod
    def _size(cls, v: str | None) -> str | None:
        parse_size(v)
        return v

    @field_validator("num_outputs_per_prompt")
    @classmethod
    def _per_prompt(cls, v: int | None, info: ValidationInfo) -> int | None:
        n = info.data.get("n")
        if v is not None and n is not None and v != n:
            raise ValueError(f"{v}, but n={n}; send one of them")
        return v

    @model_validator(mode="after")
    def _n(self) -> RequestKnobs:
        if self.num_outputs_per_prompt is not None:
            self.n = self.num_outputs_per_prompt  # one knob from here on (the caps and routing read n)
        return self

    def standard(self) -> dict[str, Any]:
        """The standard knobs that were set."""
        return {
            k: getattr(self, k)
            for k in RequestKnobs.model_fields
            if k in self.model_fields_set and getattr(self, k) is not None
        }

    def extras(self) -> dict[str, Any]:
        return {k: v for k, v in (self.model_extra or {}).items() if k not in self.IGNORED}

    def knobs(self, nested: Mapping[str, Any] | None = None, where: str = "extra_body") -> RequestKnobs:
        """Just the knobs of this body (standard + extras), with a literal nested ``extra_body`` merged over
        them; a bad nested value is an ``InvalidRequestError`` naming ``extra_body.<field>``."""
        values = {**self.standard(), **self.extras()}
        if nested:
            try:
                inner = RequestKnobs.model_validate(nested)
            except ValidationError as e:
                raise validation_error(e, f"{where}.") from None
            values.update({**inner.standard(), **inner.extras()})
        return RequestKnobs.model_validate(values)

    # -------------------------------------------------------------- routing

    def for_diffusion(self) -> dict[str, Any]:
        knobs = self.standard()
        out = {k: knobs[k] for k in self.DIFFUSION if k in knobs}
        wh = parse_size(knobs.get("size"))
        if wh is not None:
            out.setdefault("width", wh[0])
            out.setdefault("height", wh[1])
        if "n" in knobs:
            out["num_outputs_per_prompt"] = knobs["n"]
        return out

    def for_lora(self) -> dict[str, Any]:
        """The LoRA knobs, for the stages that hold the adapters (``lora_stages``)."""
        return {"lora_scale": self.lora_scale} if self.lora_scale is not None else {}

    def for_llm(self) -> dict[str, Any]:
        knobs = self.standard()
        out = {k: knobs[k] for k in self.LLM if k in knobs}
        if "max_completion_tokens" in knobs and "max_tokens" not in out:
            out["max_tokens"] = knobs["max_completion_tokens"]
        return out


def denoising_stages(pipeline: Pipeline) -> list[int]:
    """Where the standard diffusion knobs go: the stages that take them (``StageSpec.knobs``)."""
    return [s.stage_id for s in pipeline.stages if s.knobs == "diffusion"]


def lora_stages(pipeline: Pipeline) -> list[int]:
    """Where a request's adapter (``model`` naming a LoRA, ``lora`` offline) and ``lora_scale`` go: the
    diffusion stages, or (none) the llm stages. ``--lora-modules`` loads adapters into these stages."""
    diffusion = [s.stage_id for s in pipeline.stages if s.kind == "diffusion"]
    return diffusion or [s.stage_id for s in pipeline.stages if s.kind == "llm"]


def filter_extras(
    pipeline: Pipeline, extras: Mapping[str, Any], warnings: list[str] | None = None, where: str = ""
) -> dict[str, Any]:
    """Keep the keys the pipeline declares, validated as their declared type (pydantic's lax rules: a
    multipart ``"false"`` is False, ``"3"`` is 3). The rest: with a ``warnings`` list (a request over HTTP)
    one warning naming them, added to it; without one (an offline call) an error naming the first."""
    allowed = pipeline.extra_body_params
    dropped = sorted(k for k in extras if k not in allowed)
    if dropped and warnings is None:
        raise InvalidRequestError(
            f"{where}{dropped[0]}",
            f"not a parameter of pipeline {pipeline.name!r} (it declares: {', '.join(sorted(allowed)) or 'none'})",
        )
    if dropped:
        names = ", ".join(repr(where + k[:_MAX_KEY]) for k in dropped[:_MAX_LISTED])
        more = f" and {len(dropped) - _MAX_LISTED} more" if len(dropped) > _MAX_LISTED else ""
        text = f"ignored {names}{more}: not parameters of pipeline {pipeline.name!r}"
        logger.warning("%s", text)
        if text not in warnings:
            warnings.append(text)
    kept = {}
    for k, v in extras.items():
        if k in allowed:
            try:
                kept[k] = _type_adapter(allowed[k]).validate_python(v)
            except ValidationError as e:
                raise InvalidRequestError(
                    k, f"expected {getattr(allowed[k], '__name__', allowed[k])}: {e.errors()[0]['msg']}, got {v!r}"
                ) from None
    return kept


_MAX_LISTED, _MAX_KEY = 8, 64  # ignored keys named in one warning, characters of one (the caller chose them)


def _lift_fields(own: dict[str, Any], extras: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``extra_args`` keys that are fields of ``DiffusionSamplingParams`` (``cache``, its spelling before it
    became a field) move to the field, so none is dropped in silence; one set both ways to two values is an
    error."""
    rest = {}
    for k, v in extras.items():
        if k in DiffusionSamplingParams.model_fields and k != "extra_args":
            if k in own and own[k] != v:
                raise InvalidRequestError(f"{where}extra_args.{k}", f"{v!r} here, but {k}={own[k]!r}; set it once")
            own[k] = v
        else:
            rest[k] = v
    return rest


@functools.cache
def _type_adapter(typ: Any) -> TypeAdapter:
    return TypeAdapter(typ)


def stage_params(
    pipeline: Pipeline,
    defaults: Sequence[Mapping[str, Any]],
    knobs: RequestKnobs | None = None,
    given: Sequence[Any] | None = None,
    prompt: dict[str, Any] | None = None,
    warnings: list[str] | None = None,
) -> list[Any]:
    """Every stage's parameters for one request (see the module docstring). ``given`` is the caller's
    ``sampling_params_list``: per stage a partial dict, an engine's own params object, or None. A
    ``DiffusionSamplingParams`` or ``LLMSamplingParams`` counts as the dict of the fields its caller set: the
    others take the stage's defaults, as over HTTP. The pipeline's ``shape_request`` hook sees ``prompt`` and the
    merged dicts before they are typed. ``warnings`` (a request over HTTP) collects what was ignored; without it
    (offline) an undeclared ``extra_args`` key is an error."""
    n = len(pipeline.stages)
    if given is None:
        given = []
    elif not isinstance(given, (list, tuple)):
        given = [given]  # one entry: the first stage's
    if len(given) > n:
        raise InvalidRequestError("sampling_params_list", f"{len(given)} entries for a {n}-stage pipeline")
    given = list(given) + [None] * (n - len(given))
    targets = set(denoising_stages(pipeline))
    body_warnings = warnings if warnings is not None else []  # a body's unknown fields: warned about, always
    extras = filter_extras(pipeline, knobs.extras(), body_warnings) if knobs is not None else {}
    lora = prompt.pop("lora", None) if prompt is not None else None
    with_lora = set(lora_stages(pipeline))
    if lora is not None:
        if not isinstance(lora, str) or not lora:
            raise InvalidRequestError("lora", f"expected the name of a LoRA adapter, got {lora!r}")
        if not with_lora:
            raise InvalidRequestError("lora", f"pipeline {pipeline.name!r} has no stage that takes LoRA adapters")
    merged: list[Any] = []
    for spec in pipeline.stages:
        sid = spec.stage_id
        own = given[sid]
        if isinstance(own, DiffusionSamplingParams) and spec.kind == "diffusion":
            own = {k: getattr(own, k) for k in own.model_fields_set}  # what its caller set; the rest: defaults
        elif isinstance(own, LLMSamplingParams) and spec.kind == "llm":
            own = own.given()
        if own is not None and not isinstance(own, Mapping):
            merged.append(own)  # an engine's own params object (vllm.SamplingParams, DiffusionSamplingParams)
            continue
        own = dict(own or {})
        if spec.param_keys is not None:  # vLLM fields this stage has no use for: dropped, said (sampling_fields)
            own, said = drop_unread(own, spec.param_keys, f"sampling_params_list[{sid}]", spec.name)
            if said is not None:
                body_warnings.append(said)
                if warnings is None:  # offline: the log is where the caller hears it
                    logger.warning("%s", said)
        routed: dict[str, Any] = {}
        if knobs is not None and spec.knobs == "llm":
            routed = knobs.for_llm()
        elif knobs is not None and sid in targets:
            routed = knobs.for_diffusion()
        if sid in with_lora:
            routed.update(knobs.for_lora() if knobs is not None else {})
            if lora is not None:
                routed["lora"] = lora
        if sid in targets and spec.kind == "diffusion":
            own_extras = own.pop("extra_args", None) or {}
            where = f"sampling_params_list[{sid}]."
            if not isinstance(own_extras, Mapping):
                raise InvalidRequestError(f"{where}extra_args", "expected an object")
            own_extras = _lift_fields(own, own_extras, where)
            routed["extra_args"] = {**extras, **filter_extras(pipeline, own_extras, warnings, f"{where}extra_args.")}
        merged.append({**defaults[sid], **routed, **own})
    if pipeline.shape_request is not None and prompt is not None:
        pipeline.shape_request(prompt, merged)
    out: list[Any] = []
    for spec, params in zip(pipeline.stages, merged):
        where = f"sampling_params_list[{spec.stage_id}]." if given[spec.stage_id] is not None else ""
        if spec.kind == "diffusion" and isinstance(params, Mapping):
            params = DiffusionSamplingParams.from_any(params, where=where)
            _warn_true_cfg(params, prompt, warnings)
        elif spec.kind == "llm" and isinstance(params, Mapping):
            params = LLMSamplingParams.from_any(params, where=where)
        elif spec.knobs == "llm" and isinstance(params, Mapping):
            # an ar stage that samples as an llm does: the standard knobs among its params get the same checks
            # as at the top level (the stage checks the rest)
            try:
                RequestKnobs.model_validate({k: params[k] for k in RequestKnobs.LLM if k in params})
            except ValidationError as e:
                raise validation_error(e, where) from None
        out.append(params)
    return out


def _warn_true_cfg(params: DiffusionSamplingParams, prompt: Mapping[str, Any] | None, warnings: list[str] | None):
    """diffusers' rule: true CFG runs only with a negative prompt; a scale without one runs without it, said."""
    scale = params.true_cfg_scale
    negative = params.negative_prompt if prompt is None else prompt.get("negative_prompt", params.negative_prompt)
    if scale is None or scale <= 1 or negative is not None:
        return
    text = (
        f"true_cfg_scale={scale:g} without a negative_prompt: true CFG does not run (as in diffusers); "
        'send a negative_prompt (" " will do) to use it'
    )
    logger.warning("%s", text)
    if warnings is not None and text not in warnings:
        warnings.append(text)


def validation_error(e: ValidationError, where: str = "") -> InvalidRequestError:
    """A pydantic error as an ``InvalidRequestError`` naming the first bad field (``where`` prefixes it)."""
    items = []
    for item in e.errors():
        name = (where + ".".join(str(p) for p in item["loc"])).rstrip(".") or None
        msg = "unknown parameter" if item["type"] == "extra_forbidden" else item["msg"]
        items.append((name, msg))
    (field, msg), rest = items[0], items[1:]
    return InvalidRequestError(field, "; ".join([msg] + [f"{n}: {m}" for n, m in rest]))


_SIZE = re.compile(r"^(\d{1,5})x(\d{1,5})$")


def parse_size(size: str | None) -> tuple[int, int] | None:
    """``"WxH"`` -> (width, height); ``None`` / ``"auto"`` -> None."""
    if size is None or size == "auto":
        return None
    m = _SIZE.match(size)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise ValueError(f"expected 'WIDTHxHEIGHT' (e.g. '512x512') or 'auto', got {size!r}")
    return int(m.group(1)), int(m.group(2))
