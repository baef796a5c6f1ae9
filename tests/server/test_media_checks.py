"""The server's checks of media bound for llm stages (which decode them again through vLLM):
what decodes passes, what does not is a 400 naming the field, and the bytes travel as a
base64 ``data:`` URL (the client's own one untouched)."""

from __future__ import annotations

import base64
import io

import av
import numpy as np
import pytest

from omnistage.server.errors import APIError
from omnistage.server.media import (
    MediaLimits,
    as_data_url,
    audio_from_bytes,
    check_audio,
    check_image,
    check_video,
    encode_audio,
    encode_image,
    encode_mp4,
)


def _aac() -> bytes:
    """A short AAC clip in an MP4 container: a format soundfile cannot read, PyAV (and vLLM) can."""
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("aac", rate=16000)
        stream.layout = "mono"
        t = np.arange(16000) / 16000
        samples = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)[None, :]
        frame = av.AudioFrame.from_ndarray(samples, format="fltp", layout="mono")
        frame.sample_rate = 16000
        for packet in stream.encode(frame):
            container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def test_decodable_media_pass():
    from PIL import Image

    check_image(encode_image(Image.new("RGB", (8, 8), "red"), "png"), "f", MediaLimits())
    check_audio(encode_audio(np.zeros(800, np.float32), 16000, "wav"), "f")
    check_video(encode_mp4(np.zeros((3, 16, 16, 3), np.uint8), 4), "f")


def test_audio_soundfile_cannot_read_falls_back_to_pyav():
    import soundfile

    aac = _aac()
    with pytest.raises(soundfile.LibsndfileError):
        soundfile.read(io.BytesIO(aac))  # soundfile alone refuses it
    check_audio(aac, "f")
    samples, rate = audio_from_bytes(aac, "f")  # as every audio input (a reference clip, a voice upload)
    assert rate == 16000 and samples.size >= 16000 * 0.9 and np.abs(samples).max() > 0.1


@pytest.mark.parametrize(
    "check, data, message",
    [
        (
            lambda d: check_image(d, "messages[0].content[1].image_url", MediaLimits()),
            b"\x89PNG broken",
            "not a decodable image",
        ),
        (
            lambda d: check_audio(d, "messages[0].content[1].image_url"),
            b"RIFF....WAVEfmt nonsense",
            "not decodable audio",
        ),
        (
            lambda d: check_video(d, "messages[0].content[1].image_url"),
            b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 40,
            "not a decodable video",
        ),
        (
            lambda d: check_video(d, "messages[0].content[1].image_url"),
            encode_audio(np.zeros(800, np.float32), 16000),
            "no video stream",
        ),
    ],
)
def test_undecodable_media_name_the_field(check, data, message):
    with pytest.raises(APIError) as e:
        check(data)
    assert e.value.status == 400 and e.value.param == "messages[0].content[1].image_url"
    assert message in e.value.message


def test_data_urls():
    data = b"\x01\x02\x03"
    own = "data:image/png;base64," + base64.b64encode(data).decode()
    assert as_data_url(own, data) is own  # no re-encoding of what the client sent
    for url in ("https://example.com/a.png", "file:///media/a.png", "data:image/png,%01%02%03"):
        out = as_data_url(url, data)
        assert out.startswith("data:application/octet-stream;base64,")
        assert base64.b64decode(out.split(",", 1)[1]) == data
