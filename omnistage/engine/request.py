"""A request as the orchestrator sees it: the normalised prompt, per-stage
params and the modalities the caller wants back."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from omnistage.modality import OutputModality

_PROMPT_KEYS = {"prompt", "prompt_token_ids", "negative_prompt", "multi_modal_data", "modalities",
                "additional_information", "mm_processor_kwargs", "messages"}


class InvalidRequestError(ValueError):
    """The caller sent something invalid; the message names the field."""


class StageFailedError(RuntimeError):
    """A stage failed this request (other requests are unaffected)."""


@dataclass
class OmniRequest:
    request_id: str
    prompt: dict[str, Any]
    sampling_params: list[Any]  # one entry per stage: merged dict, or an engine's own params object
    modalities: OutputModality | None = None  # None: every final stage
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str | None:
        return self.prompt.get("prompt")


def normalize_prompt(prompt: str | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(prompt, str):
        return {"prompt": prompt}
    if not isinstance(prompt, Mapping):
        raise InvalidRequestError(f"prompt: expected a string or a dict, got {type(prompt).__name__}")
    unknown = sorted(set(prompt) - _PROMPT_KEYS)
    if unknown:
        raise InvalidRequestError(f"prompt: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_PROMPT_KEYS))}")
    if "prompt" not in prompt and "prompt_token_ids" not in prompt and "messages" not in prompt:
        raise InvalidRequestError("prompt: needs 'prompt', 'prompt_token_ids' or 'messages'")
    if "prompt" in prompt and not isinstance(prompt["prompt"], str):
        raise InvalidRequestError(f"prompt.prompt: expected a string, got {type(prompt['prompt']).__name__}")
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
            raise InvalidRequestError(f"modalities: {e}") from None
    if not out:
        raise InvalidRequestError("modalities: empty list")
    return out


def merge_stage_params(defaults: Mapping[str, Any], given: Any) -> Any:
    """Partial dicts merge over the stage's defaults; params objects are taken as they are."""
    if given is None:
        return dict(defaults)
    if isinstance(given, Mapping):
        return {**defaults, **given}
    return given


def new_request_id() -> str:
    return uuid.uuid4().hex
