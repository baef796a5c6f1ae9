"""vLLM's ``SamplingParams`` field names, for the stages that are not vLLM's.

Clients written for vLLM-Omni send a full vLLM ``SamplingParams`` dict to every stage of a pipeline
(``detokenize`` and ``stop_token_ids`` to a talker, ``temperature`` or ``max_tokens`` to a codec decoder). A
stage that declares the names it reads (``StageSpec.param_keys``) takes those; any other vLLM field name given
to it means nothing there and is dropped with a warning the caller sees. A name that is no vLLM field and not
the stage's either stays in, so the stage's own check refuses it naming the field.

vLLM is imported only by the llm stage, so the names are a fixed list here; a test holds it equal to vLLM's
class (tests/test_sampling_fields.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The public fields of vllm.SamplingParams (vLLM 0.32): msgspec struct fields not starting with "_".
VLLM_SAMPLING_FIELDS = frozenset(
    {
        "allowed_token_ids",
        "bad_words",
        "detokenize",
        "extra_args",
        "flat_logprobs",
        "frequency_penalty",
        "ignore_eos",
        "include_stop_str_in_output",
        "logit_bias",
        "logprob_token_ids",
        "logprobs",
        "max_tokens",
        "min_p",
        "min_tokens",
        "n",
        "output_kind",
        "output_text_buffer_length",
        "presence_penalty",
        "prompt_logprob_start",
        "prompt_logprob_token_ids",
        "prompt_logprobs",
        "repetition_detection",
        "repetition_penalty",
        "routed_experts_prompt_start",
        "seed",
        "skip_clone",
        "skip_reading_prefix_cache",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "stop",
        "stop_token_ids",
        "stream_interval",
        "structured_outputs",
        "temperature",
        "thinking_token_budget",
        "top_k",
        "top_p",
        "trace_decode_token_ids",
        "watermarking",
    }
)


def drop_unread(
    params: Mapping[str, Any], reads: frozenset[str], where: str, stage: str
) -> tuple[dict[str, Any], str | None]:
    """``params`` without the vLLM field names the stage does not read, and the warning that says so (None when
    nothing was dropped). ``where`` names the entry as the caller sent it (``sampling_params_list[2]``)."""
    unread = sorted(k for k in params if k in VLLM_SAMPLING_FIELDS and k not in reads)
    if not unread:
        return dict(params), None
    kept = {k: v for k, v in params.items() if k not in unread}
    return kept, (
        f"{where}: {', '.join(unread)} ignored: the {stage} stage does not use "
        f"{'it' if len(unread) == 1 else 'them'} (it reads {', '.join(sorted(reads)) or 'none'})"
    )
