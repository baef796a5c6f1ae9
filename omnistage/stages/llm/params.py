"""Turn a stage's sampling params (a merged dict or a caller's SamplingParams)
into a vLLM ``SamplingParams`` streaming DELTA outputs, after checking the
fields a caller most often gets wrong. Errors are ``ValueError`` naming the field,
raised before vLLM sees the request."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import RequestOutputKind

from omnistage.errors import InvalidRequestError
from omnistage.params import MAX_SEED

# Public SamplingParams fields a request may set (private ones start with "_").
ALLOWED_KEYS = frozenset(k for k in SamplingParams.__struct_fields__ if not k.startswith("_")) - {
    "output_kind",
    "skip_clone",
}


def _check_int(name: str, value: Any, *, minimum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidRequestError(name, f"expected an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise InvalidRequestError(name, f"must be >= {minimum}, got {value}")


def _check_common(get: Any, vocab_size: int) -> None:
    max_tokens = get("max_tokens")
    if max_tokens is not None:
        _check_int("max_tokens", max_tokens, minimum=1)
    temperature = get("temperature")
    if temperature is not None:
        if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
            raise InvalidRequestError("temperature", f"expected a number, got {temperature!r}")
        if temperature < 0:
            raise InvalidRequestError("temperature", f"must be >= 0, got {temperature}")
    stop_ids = get("stop_token_ids")
    if stop_ids is not None:
        if not isinstance(stop_ids, (list, tuple)):
            raise InvalidRequestError("stop_token_ids", f"expected a list of token ids, got {stop_ids!r}")
        for t in stop_ids:
            _check_int("stop_token_ids", t)
            if not 0 <= t < vocab_size:
                raise InvalidRequestError("stop_token_ids", f"{t} is outside the vocabulary (0..{vocab_size - 1})")
    n = get("n")
    if n is not None and n != 1:
        raise InvalidRequestError("n", f"an llm stage streams one completion per request, got n={n}")
    seed = get("seed")
    if seed is not None:
        _check_int("seed", seed, minimum=0)  # a negative seed has no defined meaning (params.MAX_SEED)
        if seed > MAX_SEED:
            raise InvalidRequestError("seed", f"must be <= {MAX_SEED}, got {seed}")


def to_sampling_params(params: Any, *, vocab_size: int, final_only: bool = False) -> SamplingParams:
    """A validated copy with ``output_kind=DELTA`` (``FINAL_ONLY`` where nobody reads the deltas: vLLM then
    builds one output per request instead of one per token); the caller's object is not modified."""
    kind = RequestOutputKind.FINAL_ONLY if final_only else RequestOutputKind.DELTA
    if params is None:
        params = {}
    if isinstance(params, SamplingParams):
        _check_common(lambda k: getattr(params, k), vocab_size)
        sp = params.clone()
        sp.output_kind = kind
        return sp
    if not isinstance(params, Mapping):
        raise InvalidRequestError(
            "sampling_params", f"expected a dict or vllm.SamplingParams, got {type(params).__name__}"
        )
    unknown = sorted(set(params) - ALLOWED_KEYS)
    if unknown:
        raise InvalidRequestError("sampling_params", f"unknown field(s) {', '.join(unknown)} for an llm stage")
    _check_common(params.get, vocab_size)
    params = dict(params)
    # no max_tokens: to the end of the context, as vllm serve runs (SamplingParams' own default is 16 tokens;
    # None makes vLLM's input processor take max_model_len - prompt length)
    params.setdefault("max_tokens", None)
    try:
        return SamplingParams(**params, output_kind=kind)
    except (ValueError, TypeError, VLLMValidationError) as e:  # vLLM's own checks name the parameter
        raise InvalidRequestError("sampling_params", f"{e}") from None
