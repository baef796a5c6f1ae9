"""The speech request a body becomes (``/v1/audio/speech``, a chat turn to a speech family, ``/v1/realtime``):
the voice (a preset, a registered clone, or a reference clip fetched and decoded here) and the speech fields,
every check before model work."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from omnistage.engine.request import OmniRequest
from omnistage.modality import OutputModality
from omnistage.server.errors import bad_request
from omnistage.server.media import (
    Fetched,
    decode_base64,
    fetch_media,
)
from omnistage.server.protocol import SpeechRequest
from omnistage.server.state import ServerState
from omnistage.server.voices import (
    DEFAULT_MAX_REF_AUDIO_S,
    clip_from_bytes,
    registry,
)
from omnistage.speech import SpeechInput


def preset_voices(state: ServerState) -> list[str]:
    return list(state.engine.pipeline.info.speaks.voices)


def max_ref_s(state: ServerState) -> float:
    return float(state.engine.pipeline.info.speaks.max_ref_audio_s or DEFAULT_MAX_REF_AUDIO_S)


def require_cloning(state: ServerState, field: str) -> None:
    if not state.engine.pipeline.info.speaks.supports_voice_cloning:
        raise bad_request(
            f"{field}: model {state.model_name!r} cannot clone voices; use one of the voices listed "
            "by /v1/audio/voices",
            field,
        )


async def _reference_clip(state: ServerState, ref: str) -> tuple[np.ndarray, int]:
    """``ref_audio`` as a URL (data:, http(s)://, file://) or a bare base64 string -> (samples, rate)."""
    scheme = ref.split(":", 1)[0].lower() if ":" in ref[:16] else ""
    if scheme in ("data", "http", "https", "file"):
        got = await fetch_media(ref, "ref_audio", state.media)  # with the type the URL or response declares
    else:
        got = Fetched(decode_base64(ref, "ref_audio", state.media), None)
    return await asyncio.to_thread(clip_from_bytes, got.data, "ref_audio", max_ref_s(state), state.media, got.mime)


async def _speaker(state: ServerState, body: SpeechRequest) -> dict[str, Any]:
    """The voice fields of the speech input: a preset ``voice``, or a cloned voice's clip + text."""
    if body.ref_audio is not None:
        require_cloning(state, "ref_audio")
        if body.voice is not None:
            raise bad_request("voice: give a voice or a reference clip (ref_audio), not both", "voice")
        return {"ref_audio": await _reference_clip(state, body.ref_audio), "ref_text": body.ref_text}
    if body.voice is None:
        return {"ref_text": body.ref_text} if body.ref_text is not None else {}
    presets = preset_voices(state)
    if state.engine.pipeline.info.speaks.voices_case_insensitive:  # e.g. Qwen3-TTS's speakers, as its package
        preset = next((p for p in presets if p.lower() == body.voice.lower()), None)
    else:
        preset = body.voice if body.voice in presets else None
    if preset is not None:
        return {"voice": preset, "ref_text": body.ref_text}
    voice = await registry(state).get(body.voice)
    if voice is not None:
        if body.ref_text is not None:
            raise bad_request("ref_text: a registered voice brings its own transcript", "ref_text")
        return {"ref_audio": await asyncio.to_thread(voice.samples), "ref_text": voice.text}
    known = presets + [v.name for v in await registry(state).list()]
    if known:
        raise bad_request(f"voice: {body.voice!r} is not one of {', '.join(known)}", "voice")
    return {"voice": body.voice}  # no voices listed at all: the pipeline decides


async def speech_input(state: ServerState, body: SpeechRequest) -> SpeechInput | None:
    """The request's speech input for a speech family: voice or clone, instructions, language, ... (the speech
    route's fields; chat turns to a speech family take the same ones from ``extra_body``). None: nothing set."""
    info = {
        **await _speaker(state, body),
        "speed": body.speed if body.speed != 1.0 else None,
        "instructions": body.instructions,
        "language": body.language,
        "initial_codec_chunk_frames": body.initial_codec_chunk_frames,
        "x_vector_only_mode": body.x_vector_only_mode,
        "enable_text_splitting": body.enable_text_splitting or None,
    }
    if body.enable_text_splitting and not state.engine.pipeline.info.speaks.splits_text:
        raise bad_request(
            f"enable_text_splitting: model {state.model_name!r} does not split a text into sentences",
            "enable_text_splitting",
        )
    fields = {k: v for k, v in info.items() if v is not None}
    return SpeechInput(**fields) if fields else None


async def build_speech_request(state: ServerState, body: SpeechRequest, rid: str) -> OmniRequest:
    """A speech body as the engine's request, every check before model work (also /v1/realtime's path)."""
    lora = state.check_model(body.model)
    state.require(OutputModality.AUDIO, "audio")
    if body.speed != 1.0 and not state.engine.pipeline.info.speaks.supports_speed:
        raise bad_request(f"speed: model {state.model_name!r} does not support changing the speed", "speed")
    if body.stream and body.stream_format == "audio" and body.return_stage_metrics:
        raise bad_request(
            "return_stage_metrics: a raw audio stream has no place for them; set stream_format to 'sse' "
            "(they come in the speech.audio.done event)",
            "return_stage_metrics",
        )
    nested = dict(body.extra_body or {})
    if body.max_new_tokens is not None:
        nested["max_tokens"] = body.max_new_tokens
    knobs = body.knobs(nested)
    prompt: dict[str, Any] = {"prompt": body.input}
    speech = await speech_input(state, body)
    if speech is not None:
        prompt["speech"] = speech
    return state.make_request(
        prompt, rid, body.sampling_params_list, output_modalities=["audio"], knobs=knobs, lora=lora
    )
