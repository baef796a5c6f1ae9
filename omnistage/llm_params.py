"""``LLMSamplingParams``: an llm stage's parameters, typed once at admission.

Its fields are the public fields of vLLM's ``SamplingParams`` a request may set (held equal to vLLM's class by
tests/test_sampling_fields.py; vLLM is imported only by the llm stage), plus the LoRA adapter the request names.
A field nobody set stays ``UNSET``: the stage passes only the fields that were set to ``SamplingParams(...)``, so
vLLM's own defaults hold for the rest, and encoding omits them, so which fields were set survives the transport.

``from_any`` checks what needs no model (types, ranges, ``n``, unknown fields) and names the field; the llm stage
checks what needs its model (``stop_token_ids`` within the vocabulary) and what only vLLM knows.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Annotated, Any, get_type_hints

import msgspec
from msgspec import UNSET, Meta, UnsetType

from omnistage.errors import InvalidRequestError

MAX_SEED = 2**63 - 1  # torch generators and vLLM take 64-bit seeds; negative ones have no defined meaning

Penalty = Annotated[float, Meta(ge=-2, le=2)]


class LLMSamplingParams(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    # the ranges are RequestKnobs' (a top-level knob and a per-stage entry get the same bounds); vLLM checks the rest
    max_tokens: Annotated[int, Meta(ge=1)] | None | UnsetType = UNSET  # None / unset: to the end of the context
    temperature: Annotated[float, Meta(ge=0)] | UnsetType = UNSET
    top_p: Annotated[float, Meta(gt=0, le=1)] | UnsetType = UNSET
    top_k: int | UnsetType = UNSET
    min_p: Annotated[float, Meta(ge=0, le=1)] | UnsetType = UNSET
    min_tokens: Annotated[int, Meta(ge=0)] | UnsetType = UNSET
    seed: Annotated[int, Meta(ge=0, le=MAX_SEED)] | None | UnsetType = UNSET
    stop: str | list[str] | None | UnsetType = UNSET
    stop_token_ids: list[int] | None | UnsetType = UNSET
    presence_penalty: Penalty | UnsetType = UNSET
    frequency_penalty: Penalty | UnsetType = UNSET
    repetition_penalty: Annotated[float, Meta(gt=0)] | UnsetType = UNSET
    ignore_eos: bool | UnsetType = UNSET
    n: int | UnsetType = UNSET  # an llm stage streams one completion: 1 (checked in from_any)
    allowed_token_ids: list[int] | None | UnsetType = UNSET
    bad_words: list[str] | None | UnsetType = UNSET
    logit_bias: dict[int, float] | None | UnsetType = UNSET
    logprobs: int | None | UnsetType = UNSET
    prompt_logprobs: int | None | UnsetType = UNSET
    prompt_logprob_start: int | None | UnsetType = UNSET
    logprob_token_ids: list[int] | None | UnsetType = UNSET
    flat_logprobs: bool | UnsetType = UNSET
    detokenize: bool | UnsetType = UNSET
    skip_special_tokens: bool | UnsetType = UNSET
    spaces_between_special_tokens: bool | UnsetType = UNSET
    include_stop_str_in_output: bool | UnsetType = UNSET
    stream_interval: int | None | UnsetType = UNSET
    output_text_buffer_length: int | UnsetType = UNSET
    skip_reading_prefix_cache: bool | None | UnsetType = UNSET
    thinking_token_budget: int | None | UnsetType = UNSET
    routed_experts_prompt_start: int | UnsetType = UNSET
    trace_decode_token_ids: list[int] | None | UnsetType = UNSET
    watermarking: bool | None | UnsetType = UNSET
    extra_args: dict[str, Any] | None | UnsetType = UNSET
    # vLLM's own classes (or what builds them): the stage hands them over as they are and vLLM checks them
    structured_outputs: Any = UNSET
    repetition_detection: Any = UNSET
    prompt_logprob_token_ids: Any = UNSET
    # the LoRA adapter the request names (``model`` over HTTP) and its scale: the stage's, not vLLM's fields
    lora: str | UnsetType = UNSET
    lora_scale: float | UnsetType = UNSET

    @classmethod
    def from_any(cls, value: LLMSamplingParams | Mapping[str, Any] | None, where: str = "") -> LLMSamplingParams:
        """An object as it is; a dict (the merged layers, or one that crossed processes) checked and typed; None:
        nothing set. Raises ``InvalidRequestError`` naming the field (``where`` is put in front of its name)."""
        if isinstance(value, cls):
            return value
        if value is None:
            return cls()
        if not isinstance(value, Mapping):
            raise InvalidRequestError(
                where.rstrip(".") or "sampling_params", f"expected an object, got {type(value).__name__}"
            )
        unknown = sorted(set(value) - set(cls.__struct_fields__))
        if unknown:
            raise InvalidRequestError(
                where.rstrip(".") or "sampling_params", f"unknown field(s) {', '.join(unknown)} for an llm stage"
            )
        try:
            params = msgspec.convert(dict(value), cls, str_keys=True)  # str_keys: logit_bias as JSON sends it
        except msgspec.ValidationError:
            raise _first_error(value, where) from None
        if params.n is not UNSET and params.n != 1:
            raise InvalidRequestError(f"{where}n", f"an llm stage streams one completion per request, got n={params.n}")
        return params

    def get(self, name: str, default: Any = None) -> Any:
        """A field's value, ``default`` when nobody set it."""
        value = getattr(self, name)
        return default if value is UNSET else value

    def given(self) -> dict[str, Any]:
        """The fields that were set (what reaches vLLM's ``SamplingParams``)."""
        return {k: v for k in self.__struct_fields__ if (v := getattr(self, k)) is not UNSET}

    def under(self, defaults: Mapping[str, Any]) -> LLMSamplingParams:
        """``defaults`` (a stage's own, e.g. a checkpoint's generation config) for the fields nobody set."""
        return LLMSamplingParams.from_any({**defaults, **self.given()})


_HINTS = get_type_hints(LLMSamplingParams, include_extras=True)  # (the annotations are strings in this module)
_FIELD_TYPES = {f.name: f.type for f in msgspec.inspect.type_info(LLMSamplingParams).fields}
_WORDS = {
    msgspec.inspect.IntType: "an integer",
    msgspec.inspect.FloatType: "a number",
    msgspec.inspect.BoolType: "true or false",
    msgspec.inspect.StrType: "a string",
    msgspec.inspect.DictType: "an object",
    msgspec.inspect.NoneType: "null",
}


def _first_error(value: Mapping[str, Any], where: str) -> InvalidRequestError:
    """The first field of ``value`` that does not convert, with what was wrong in words (msgspec's own messages
    name types by their JSON names)."""
    for name, v in value.items():
        try:
            msgspec.convert(v, _HINTS[name], str_keys=True)
        except msgspec.ValidationError:
            return InvalidRequestError(f"{where}{name}", _explain(_FIELD_TYPES[name], v))
    return InvalidRequestError(where.rstrip(".") or "sampling_params", "not a valid llm stage parameter set")


def _explain(typ: msgspec.inspect.Type, v: Any) -> str:
    members = getattr(typ, "types", (typ,))
    for t in members:  # the right kind of value, out of its range
        if _is_kind(t, v):
            for bound, words, holds in _BOUNDS:
                limit = getattr(t, bound, None)
                if limit is not None and not holds(v, limit):
                    return f"Input should be {words} {limit}"
    words = []
    for t in members:
        if isinstance(t, msgspec.inspect.ListType):
            words.append(f"a list of {'token ids' if isinstance(t.item_type, msgspec.inspect.IntType) else 'strings'}")
        else:
            words.append(_WORDS.get(type(t), "a valid value"))
    return f"expected {' or '.join(words)}, got {v!r}"


# worded as pydantic words them, so a top-level knob (RequestKnobs) and a per-stage entry read the same
_BOUNDS = (
    ("ge", "greater than or equal to", operator.ge),
    ("gt", "greater than", operator.gt),
    ("le", "less than or equal to", operator.le),
    ("lt", "less than", operator.lt),
)


def _is_kind(t: msgspec.inspect.Type, v: Any) -> bool:
    """``v`` is a number of ``t``'s kind (so only its range can be wrong); a bool is no number here."""
    if isinstance(v, bool):
        return False
    if isinstance(t, msgspec.inspect.IntType):
        return isinstance(v, int)
    return isinstance(t, msgspec.inspect.FloatType) and isinstance(v, (int, float))
