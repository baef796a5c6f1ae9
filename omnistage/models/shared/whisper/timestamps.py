"""Whisper's timestamp rules as a vLLM v1 logits processor, on for the requests that ask for them.

vLLM's sampler applies none of the rules Whisper's timestamp decoding needs (``vllm serve`` 0.32 asks for
timestamps in verbose_json by ending the decoder prompt ``<|0.00|>`` and samples freely), so a tiny or an
unsure model writes timestamps out of order, unpaired or never. These are the rules of openai-whisper's
``ApplyTimestampRules`` as transformers' ``WhisperTimeStampLogitsProcessor`` applies them, at each step:

- ``<|notimestamps|>`` is never sampled;
- timestamps come in pairs: after a timestamp that closes text comes another timestamp (or the end); after a
  pair comes text (as transformers, "text" is every id below the end-of-text token);
- timestamps never decrease, and a new segment may not start where the last one ended;
- the first sampled token is a timestamp, at most ``max_initial_timestamp_index`` (generation_config);
- a timestamp is forced when the summed probability of all timestamps beats the most likely text token.

A decoder prompt that ends in a timestamp (``...<|transcribe|><|0.00|>``, ``vllm serve``'s verbose prompt
and the transcription route's) has its first timestamp given: the rules count it as sampled, as if the model
had written it, so the first sampled token is text (transformers gives the same sequence for the prompt
``...<|transcribe|>`` with ``max_initial_timestamp_index=0``: it must write ``<|0.00|>`` first).

Load it with the engine argument ``logits_processors=[TIMESTAMP_RULES]`` (omnistage/models/whisper/__init__.py:
``omnistage.models.shared.whisper.timestamps:WhisperTimestampRules``; ``vllm serve --logits-processors`` the same; the
whisper family's llm stage loads it) and turn it on per request with
``SamplingParams(extra_args={"whisper_timestamps": True})`` (``vllm serve``: the form field
``vllm_xargs='{"whisper_timestamps": 1}'``). Other requests are not touched. The token ids are the folder's
(generation_config ``no_timestamps_token_id``, ``eos_token_id``; the timestamps follow ``<|notimestamps|>``, as
transformers assumes), read through vLLM's ``ModelConfig.try_get_generation_config``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

from omnistage.models.shared.whisper.prompt import TIMESTAMPS_ARG

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TimestampTokens:
    no_timestamps: int
    eos: int
    max_initial_index: int | None = None  # None: the first timestamp may be any

    @property
    def begin(self) -> int:
        """``<|0.00|>``: every id from it on is a timestamp (0.02 s apart)."""
        return self.no_timestamps + 1

    @classmethod
    def from_generation_config(cls, config: Mapping[str, Any]) -> TimestampTokens | None:
        """None for a folder whose generation_config lacks them (the family then offers no timestamps)."""
        no_ts = config.get("no_timestamps_token_id")
        eos = config.get("eos_token_id")
        eos = eos[0] if isinstance(eos, Sequence) and eos else eos
        eos = eos if eos is not None else config.get("bos_token_id")  # (transformers' fallback)
        if not isinstance(no_ts, int) or not isinstance(eos, int):
            return None
        return cls(no_ts, eos, config.get("max_initial_timestamp_index"))


class TimestampRules:
    """The rules for one request: ``(prompt_ids, output_ids, logits row) -> logits row`` (changed in place)."""

    def __init__(self, tokens: TimestampTokens):
        self.t = tokens

    def __call__(self, prompt_ids: list[int], output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        begin, neg = self.t.begin, float("-inf")
        # a prompt ending in a timestamp gave the first one: it counts as sampled
        given = prompt_ids[-1:] if prompt_ids and prompt_ids[-1] >= begin else []
        seq = given + list(output_ids[-2:])
        logits[self.t.no_timestamps] = neg
        last_ts = len(seq) >= 1 and seq[-1] >= begin
        penultimate_ts = len(seq) < 2 or seq[-2] >= begin
        if last_ts:
            if penultimate_ts:  # a pair (or the first timestamp) was just closed: text comes next
                logits[begin:] = neg
            else:  # a timestamp closed text: the next is a timestamp or the end
                logits[: self.t.eos] = neg
        latest = next((t for t in reversed(output_ids) if t >= begin), given[0] if given else None)
        if latest is not None:
            # never back in time; a timestamp opening a segment is later than the one that closed the last
            logits[begin : latest if last_ts and not penultimate_ts else latest + 1] = neg
        if not given and not output_ids:  # the first sampled token: a timestamp, not too late
            logits[:begin] = neg
            if self.t.max_initial_index is not None:
                logits[begin + self.t.max_initial_index + 1 :] = neg
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        if logprobs[begin:].logsumexp(dim=-1) > logprobs[:begin].max():
            logits[:begin] = neg
        return logits


class WhisperTimestampRules(AdapterLogitsProcessor):
    """vLLM's per-request adapter around ``TimestampRules`` (requests without the extra arg: none)."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool):
        super().__init__(vllm_config, device, is_pin_memory)
        self.tokens = TimestampTokens.from_generation_config(vllm_config.model_config.try_get_generation_config())
        if self.tokens is None:  # the engine still serves; folder_info offers no timestamps for such a folder
            logger.warning(
                "Whisper timestamp rules off: the generation_config has no no_timestamps_token_id / eos_token_id"
            )

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        value = (sampling_params.extra_args or {}).get(TIMESTAMPS_ARG)
        if value is not None and not isinstance(value, (bool, int)):
            raise ValueError(f"extra_args.{TIMESTAMPS_ARG}: expected true/false (or 1/0), got {value!r}")

    def is_argmax_invariant(self) -> bool:
        return False  # it changes which token is most likely

    def new_req_logits_processor(self, params: SamplingParams) -> TimestampRules | None:
        asked = (params.extra_args or {}).get(TIMESTAMPS_ARG)
        return TimestampRules(self.tokens) if asked and self.tokens is not None else None
