"""Whisper's decoder prompt and the request shape the family takes (no torch, no vLLM).

A recogniser request is ``{"prompt": previous text (may be ""), "multi_modal_data": {"audio": (samples,
rate)}, "transcription": Transcription(language="en", task="transcribe" | "translate")}`` (or
``Transcription(detect_language=True)``: the prompt that makes the next token the spoken language) — the same
shape any recogniser family takes (the transcription routes build it). The family's request hook turns it
into the explicit encoder-decoder prompt vLLM's Whisper takes::

    {"encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": ...}},
     "decoder_prompt": "<|startofprev|> previous<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"}

The previous-text marker is Whisper's own ``<|startofprev|>`` (what transformers' ``prompt_ids`` use);
vLLM 0.32's ``get_generation_prompt`` writes ``<|prev|>``, which is not a token of any released Whisper
vocabulary (it is tokenized as plain text there). vLLM puts ``<|startoftranscript|>`` (the decoder start
token) in front of a decoder prompt that does not begin with it, so with previous text the decoder sees
one token more than transformers' ``generate(prompt_ids=...)`` gives it (tests/models/whisper).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omnistage.errors import InvalidRequestError
from omnistage.speech import Transcription

TASKS = ("transcribe", "translate")
SAMPLE_RATE = 16000
WINDOW_S = 30  # the encoder hears 30 s at a time (3000 mel frames); longer audio is cut into windows
# openai-whisper's sample_len (n_text_ctx // 2): a window's text never needs more
DEFAULT_MAX_TOKENS = 224
START = "<|startoftranscript|>"
TIMESTAMPS_ARG = "whisper_timestamps"  # the SamplingParams.extra_args key that turns timestamps.py's rules on

# Whisper's language codes (transformers' LANGUAGES, in token order), without importing transformers.
LANGUAGES = (
    "en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no th ur hr bg lt la "
    "mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw gl mr pa si km sn yo so af oc ka be "
    "tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl mg as tt haw ln ha ba jw su yue"
).split()


def decoder_prompt(language: str, task: str = "transcribe", previous: str = "", timestamps: bool = False) -> str:
    # " " + text: how openai-whisper and transformers' get_prompt_ids write the previous text
    head = f"<|startofprev|> {previous.strip()}" if previous.strip() else ""
    # timestamps: vllm serve's verbose prompt, the first timestamp given (timestamps.py's rules take it from there)
    return head + f"{START}<|{language}|><|{task}|>" + ("<|0.00|>" if timestamps else "<|notimestamps|>")


def check_language(language: Any, field: str = "language") -> str:
    if not isinstance(language, str) or language.lower() not in LANGUAGES:
        raise InvalidRequestError(field, f"{language!r} is not a Whisper language code (ISO 639-1, e.g. 'en')")
    return language.lower()


def to_encoder_decoder(prompt: dict[str, Any], params: list[Any]) -> None:
    """The family's request hook: a recogniser request becomes Whisper's explicit prompt (in place);
    an explicit ``encoder_prompt`` passes as it is. Stage 0 gets the default ``max_tokens``; a request with
    ``Transcription(timestamps=True)`` gets the prompt ending ``<|0.00|>`` and turns the stage's timestamp
    rules on (timestamps.py)."""
    if isinstance(params[0], dict):
        params[0].setdefault("max_tokens", DEFAULT_MAX_TOKENS)
    if "encoder_prompt" in prompt:
        return
    mm = prompt.get("multi_modal_data")
    if not isinstance(mm, Mapping) or mm.get("audio") is None:
        raise InvalidRequestError("multi_modal_data.audio", "a Whisper request needs the audio to transcribe")
    info = prompt.pop("transcription", None) or Transcription()
    encoder_prompt = {"prompt": "", "multi_modal_data": {"audio": mm["audio"]}}
    if info.detect_language:
        # Whisper's own language detection: the decoder sees the start token alone and its next token is the
        # language (the caller restricts it to the language tokens, as openai-whisper and transformers do)
        prompt.pop("prompt", None)
        prompt.pop("multi_modal_data")
        prompt.update(encoder_prompt=encoder_prompt, decoder_prompt=START)
        return
    language = check_language(info.language or "en")
    task = info.task
    if task not in TASKS:
        raise InvalidRequestError("task", f"expected one of {', '.join(TASKS)}, got {task!r}")
    previous = prompt.pop("prompt", None) or ""
    if not isinstance(previous, str):
        raise InvalidRequestError("prompt", f"expected a string, got {type(previous).__name__}")
    prompt.pop("multi_modal_data")
    prompt["encoder_prompt"] = encoder_prompt
    timestamps = info.timestamps
    prompt["decoder_prompt"] = decoder_prompt(language, task, previous, timestamps)
    if timestamps and isinstance(params[0], dict):
        extra = params[0].get("extra_args") or {}
        if not isinstance(extra, Mapping):
            raise InvalidRequestError("extra_args", f"expected an object, got {type(extra).__name__}")
        params[0]["extra_args"] = {**extra, TIMESTAMPS_ARG: True}
