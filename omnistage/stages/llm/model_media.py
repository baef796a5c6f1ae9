"""Media in the one form every entry point gives a model, before vLLM's renderer sees them: audio resampled
once to the rate the model's processor hears (soxr, media_intake.py), PIL images as RGB. Offline callers may
send any rate; the server's inline audio already is at the model's rate (a header read tells)."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any


def is_audio_item(value: Any) -> bool:
    """``(samples, rate)``: one audio item as ``multi_modal_data`` holds it."""
    return (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and isinstance(value[1], numbers.Real)
        and not isinstance(value[1], bool)
    )


def in_model_form(engine: Any, mm: dict[str, Any] | None) -> dict[str, Any] | None:
    """``multi_modal_data`` in the one form every entry point gives a model (media_intake.py): an audio item
    ``(samples, rate)`` at another rate than the model's is resampled here, once, with soxr (vLLM's own
    resampler would want torchaudio); PIL images become RGB (EXIF orientation, first frame) as over HTTP."""
    if not mm:
        return mm
    from omnistage.media_intake import resample, rgb_image

    out = dict(mm)
    target = _model_audio_rate(engine) if mm.get("audio") else None
    if target:
        out["audio"] = [
            (resample(a[0], a[1], target), target) if is_audio_item(a) and int(a[1]) != target else a
            for a in mm["audio"]
        ]
    from PIL import Image

    images = mm.get("image")
    if isinstance(images, Image.Image):
        out["image"] = rgb_image(images)
    elif isinstance(images, (list, tuple)):  # not a Mapping: a model's own image form (GLM-Image's VQ token ids)
        out["image"] = [rgb_image(im) if isinstance(im, Image.Image) else im for im in images]
    return out


async def messages_in_model_form(engine: Any, messages: list[Any]) -> list[Any]:
    """The messages with every audio part that is not mono at the model's rate made so: decoded by vLLM's own
    loader, resampled once (media_intake), a float WAV. Inline parts (``input_audio``, a base64 ``data:``
    ``audio_url``): the server's already are (a header read tells); an offline caller's may be at any rate.
    An ``audio_url`` vLLM would fetch (http(s), ``file://``) is fetched here by vLLM's own connector, under the
    engine's ``allowed_local_media_path`` / ``allowed_media_domains``; one that does not load is left as it is,
    for vLLM to report as before."""
    changed: dict[tuple[int, int], dict[str, Any]] = {}
    target = connector = None
    for i, msg in enumerate(messages):
        content = msg.get("content") if isinstance(msg, Mapping) else None
        for j, part in enumerate(content if isinstance(content, list) else []):
            kind, data = _inline_audio(part)
            url = _fetched_audio_url(part) if kind == "audio_url" and data is None else None
            if data is None and url is None:
                continue
            target = target or _model_audio_rate(engine)
            if not target:
                return messages
            if url is not None:
                connector = connector or _media_connector(engine)
                wav = await _fetched_at_rate(connector, url, target)
            else:
                wav = _audio_at_rate(data, target)
            if wav is not None:
                changed[(i, j)] = _audio_part(part, kind, wav)
    if not changed:
        return messages
    out = []
    for i, msg in enumerate(messages):
        if any(k[0] == i for k in changed):
            msg = {**msg, "content": [changed.get((i, j), p) for j, p in enumerate(msg["content"])]}
        out.append(msg)
    return out


def _inline_audio(part: Any) -> tuple[str, bytes | None]:
    import base64
    import binascii

    if not isinstance(part, Mapping):
        return "", None
    kind = part.get("type") or next((k for k in ("input_audio", "audio_url") if k in part), "")
    payload = part.get(kind)
    if kind == "input_audio" and isinstance(payload, Mapping):
        text = payload.get("data")
    elif kind == "audio_url":
        url = payload.get("url") if isinstance(payload, Mapping) else payload
        header, sep, text = url.partition(",") if isinstance(url, str) else ("", "", "")
        if not (sep and header.startswith("data:") and header.endswith(";base64")):
            return kind, None  # a URL vLLM fetches itself
    else:
        return kind, None
    try:
        return kind, base64.b64decode(text, validate=True) if isinstance(text, str) else None
    except (binascii.Error, ValueError):
        return kind, None  # vLLM's own loader says what is wrong


def _fetched_audio_url(part: Mapping[str, Any]) -> str | None:
    payload = part.get("audio_url")
    url = payload.get("url") if isinstance(payload, Mapping) else payload
    if isinstance(url, str) and url.split(":", 1)[0].lower() in ("http", "https", "file"):
        return url
    return None


def _media_connector(engine: Any) -> Any:
    """vLLM's media connector as its chat renderer builds it (the same fetch limits, paths and domains)."""
    from vllm import envs
    from vllm.multimodal.media import MEDIA_CONNECTOR_REGISTRY

    mc = engine.model_config
    return MEDIA_CONNECTOR_REGISTRY.load(
        envs.VLLM_MEDIA_CONNECTOR,
        media_io_kwargs=mc.multimodal_config.media_io_kwargs if mc.multimodal_config else None,
        allowed_local_media_path=mc.allowed_local_media_path,
        allowed_media_domains=mc.allowed_media_domains,
    )


async def _fetched_at_rate(connector: Any, url: str, target: int) -> bytes | None:
    """The audio at ``url`` as a mono float WAV at ``target`` (fetched and decoded once, by vLLM's loader);
    None when it does not load (vLLM's renderer then reports it as before)."""
    from omnistage.media_intake import resample, wav_bytes

    try:
        samples, rate = await connector.fetch_audio_async(url)
    except Exception:  # a path outside the allowed folder, a failed download, an undecodable file: vLLM's to say
        return None
    return wav_bytes(resample(samples, rate, target), target)


def _audio_at_rate(data: bytes, target: int) -> bytes | None:
    """``data`` as a mono float WAV at ``target``; None when it already is one, or does not decode (vLLM's
    loader then refuses it itself)."""
    import io

    import soundfile
    from vllm.multimodal.media import AudioMediaIO

    from omnistage.media_intake import resample, wav_bytes

    try:
        info = soundfile.info(io.BytesIO(data))
        if info.samplerate == target and info.channels == 1:
            return None
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError):
        pass  # not a format libsndfile reads: decoded below
    try:
        samples, rate = AudioMediaIO().load_bytes(data)
    except Exception:  # any decoder failure: left for vLLM's own loader to report, as before
        return None
    return wav_bytes(resample(samples, rate, target), target)


def _audio_part(part: Mapping[str, Any], kind: str, wav: bytes) -> dict[str, Any]:
    import base64

    text = base64.b64encode(wav).decode("ascii")
    if kind == "input_audio":
        return {**part, "type": kind, "input_audio": {"data": text, "format": "wav"}}
    return {**part, "type": kind, "audio_url": {"url": f"data:audio/wav;base64,{text}"}}


def _model_audio_rate(engine: Any) -> int | None:
    """The rate the model's processor hears (vLLM's data parser would resample anything else to it)."""
    info = engine.renderer.get_mm_processor().info
    resampler = getattr(info.data_parser, "audio_resampler", None)
    rate = getattr(resampler, "target_sr", None)
    return int(rate) if rate else None
