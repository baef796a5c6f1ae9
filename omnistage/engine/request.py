"""A request as the orchestrator sees it: the normalised prompt, per-stage
params and the modalities the caller wants back."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from omnistage.errors import InvalidRequestError
from omnistage.modality import OutputModality
from omnistage.speech import SpeechInput, check_speech, check_transcription

# lora: the name of a LoRA adapter (params.stage_params routes it to the stages holding adapters);
# encoder_prompt / decoder_prompt: an encoder-decoder model's explicit prompt (Whisper). The typed keys below
# (TYPED_KEYS) are checked here, once, so a stage never meets a wrong-typed one.
_PROMPT_KEYS = {
    "prompt",
    "prompt_token_ids",
    "negative_prompt",
    "multi_modal_data",
    "modalities",
    "mm_processor_kwargs",
    "messages",
    "lora",
    "encoder_prompt",
    "decoder_prompt",
    "speech",
    "transcription",
    "chat_template_kwargs",
    "system_prompt",
    "image_size",
}


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

    @property
    def speech(self) -> SpeechInput | None:
        return self.prompt.get("speech")


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
    out = dict(prompt)
    for key, check in TYPED_KEYS.items():
        if out.get(key) is not None:
            out[key] = check(out[key])
    return out


def _chat_template_kwargs(value: Any) -> dict[str, Any]:
    """The chat template's keyword arguments (``add_generation_prompt``, ``continue_final_message``, ...)."""
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise InvalidRequestError("chat_template_kwargs", f"expected an object, got {type(value).__name__}")
    return dict(value)


def _system_prompt(value: Any) -> str:
    """A system prompt that replaces a stage's own (prompt_expand)."""
    if not isinstance(value, str):
        raise InvalidRequestError("system_prompt", f"expected a string, got {type(value).__name__}")
    return value


def _image_size(value: Any) -> tuple[int, int]:
    """The (height, width) of the image a multi-stage pipeline draws, for a stage that must know it before the
    stage that draws it runs (GLM-Image's AR stage lays its tokens on the target grid)."""
    if (
        not isinstance(value, (tuple, list))
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise InvalidRequestError("image_size", f"expected (height, width) as two integers, got {value!r}")
    return int(value[0]), int(value[1])


TYPED_KEYS: dict[str, Callable[[Any], Any]] = {
    "speech": check_speech,
    "transcription": check_transcription,
    "chat_template_kwargs": _chat_template_kwargs,
    "system_prompt": _system_prompt,
    "image_size": _image_size,
}


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
