"""Turn a stage's sampling params (the ``LLMSamplingParams`` typed at admission, or a caller's own
``SamplingParams``) into a vLLM ``SamplingParams`` streaming DELTA outputs. Types, ranges and field names were
checked at admission (omnistage.llm_params); what needs the model (token ids within its vocabulary) is checked
here. Errors are ``InvalidRequestError`` naming the field, raised before vLLM sees the request."""

from __future__ import annotations

from typing import Any

from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import RequestOutputKind

from omnistage.errors import InvalidRequestError
from omnistage.llm_params import LLMSamplingParams

# what a caller's own SamplingParams object is held to as well (it is vLLM-checked, but not for these)
_OBJECT_CHECKED = ("n", "seed")


def llm_params(params: Any) -> LLMSamplingParams | SamplingParams:
    """A request's params as this stage takes them: typed at admission, or a dict from another caller (a
    direct engine call, an open duplex session, or typed params that crossed a process as their set fields)
    typed here, or a caller's own ``SamplingParams``."""
    return params if isinstance(params, SamplingParams) else LLMSamplingParams.from_any(params)


def _check_vocabulary(stop_ids: list[int] | None, vocab_size: int) -> None:
    for t in stop_ids or ():
        if not 0 <= t < vocab_size:
            raise InvalidRequestError("stop_token_ids", f"{t} is outside the vocabulary (0..{vocab_size - 1})")


def to_sampling_params(
    params: LLMSamplingParams | SamplingParams, *, vocab_size: int, final_only: bool = False
) -> SamplingParams:
    """A checked copy with ``output_kind=DELTA`` (``FINAL_ONLY`` where nobody reads the deltas: vLLM then
    builds one output per request instead of one per token); the caller's object is not modified."""
    kind = RequestOutputKind.FINAL_ONLY if final_only else RequestOutputKind.DELTA
    if isinstance(params, SamplingParams):
        LLMSamplingParams.from_any({k: getattr(params, k) for k in _OBJECT_CHECKED})
        _check_vocabulary(params.stop_token_ids, vocab_size)
        sp = params.clone()
        sp.output_kind = kind
        return sp
    if not isinstance(params, LLMSamplingParams):
        raise InvalidRequestError(
            "sampling_params", f"expected LLMSamplingParams or vllm.SamplingParams, got {type(params).__name__}"
        )
    _check_vocabulary(params.get("stop_token_ids"), vocab_size)
    given = params.given()
    for own in ("lora", "lora_scale"):  # the stage's (loras.py), not vLLM's
        given.pop(own, None)
    # no max_tokens: to the end of the context, as vllm serve runs (SamplingParams' own default is 16 tokens;
    # None makes vLLM's input processor take max_model_len - prompt length)
    given.setdefault("max_tokens", None)
    try:
        return SamplingParams(**given, output_kind=kind)
    except (ValueError, TypeError, VLLMValidationError) as e:  # vLLM's own checks name the parameter
        raise InvalidRequestError("sampling_params", f"{e}") from None
