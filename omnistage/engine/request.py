"""A request as the orchestrator sees it: the normalised prompt, per-stage
params and the modalities the caller wants back."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from omnistage.errors import InvalidRequestError
from omnistage.modality import OutputModality

# lora: the name of a LoRA adapter (params.stage_params routes it to the stages holding adapters)
_PROMPT_KEYS = {
    "prompt",
    "prompt_token_ids",
    "negative_prompt",
    "multi_modal_data",
    "modalities",
    "additional_information",
    "mm_processor_kwargs",
    "messages",
    "lora",
    "encoder_prompt",
    "decoder_prompt",
}  # an encoder-decoder model's explicit prompt (Whisper)


@dataclass
class OmniRequest:
    request_id: str
    prompt: dict[str, Any]
    sampling_params: list[Any]  # one entry per stage, parsed and merged once (params.stage_params)
    modalities: OutputModality | None = None  # None: every final stage
    extra: dict[str, Any] = field(default_factory=dict)
    stream: bool = True  # False: the caller reads only the final outputs (a whole HTTP answer), not the deltas
    warnings: list[str] = field(default_factory=list)  # what the request asked that is ignored (HTTP: said back)
    session_id: str | None = None  # its conversation: every stage serves it on the replica that served the last turn

    @property
    def text(self) -> str | None:
        return self.prompt.get("prompt")


def normalize_prompt(prompt: str | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(prompt, str):
        return {"prompt": prompt}
    if not isinstance(prompt, Mapping):
        raise InvalidRequestError("prompt", f"expected a string or a dict, got {type(prompt).__name__}")
    unknown = sorted(set(prompt) - _PROMPT_KEYS)
    if unknown:
        raise InvalidRequestError(
            "prompt", f"unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_PROMPT_KEYS))}"
        )
    if not any(k in prompt for k in ("prompt", "prompt_token_ids", "messages", "encoder_prompt")):
        raise InvalidRequestError("prompt", "needs 'prompt', 'prompt_token_ids', 'messages' or 'encoder_prompt'")
    if "prompt" in prompt and not isinstance(prompt["prompt"], str):
        raise InvalidRequestError("prompt.prompt", f"expected a string, got {type(prompt['prompt']).__name__}")
    return dict(prompt)


def parse_modalities(value: Sequence[str] | str | OutputModality | None) -> OutputModality | None:
    if value is None or isinstance(value, OutputModality):
        return value
    if isinstance(value, str):
        value = [value]
    out = OutputModality(0)
    for name in value:
        try:
            out |= OutputModality.parse(name)
        except ValueError as e:
            raise InvalidRequestError("modalities", f"{e}") from None
    if not out:
        raise InvalidRequestError("modalities", "empty list")
    return out


def new_request_id() -> str:
    return uuid.uuid4().hex
