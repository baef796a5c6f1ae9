"""media.py (decode / encode, local-file allowlist, limits) and storage.py (TTL sweeper, no path traversal)."""

from __future__ import annotations

import asyncio
import base64
import io
import os
import time

import av
import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from omnistage.config.settings import ServerSettings, StorageSettings
from omnistage.server.errors import APIError
from omnistage.server.media import (
    MediaLimits,
    audio_from_bytes,
    encode_audio,
    encode_image,
    encode_mp4,
    fetch_bytes,
    image_from_bytes,
    load_image,
    pcm16,
)
from omnistage.server.storage import InvalidName, MediaStore


def _png(size=(6, 4), color=(10, 20, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


async def test_data_and_file_urls(tmp_path):
    (tmp_path / "a.png").write_bytes(_png())
    limits = MediaLimits(allowed_local_media_path=tmp_path)
    img = await load_image("data:image/png;base64," + base64.b64encode(_png()).decode(), "f", limits)
    assert img.size == (6, 4) and img.getpixel((0, 0)) == (10, 20, 30)
    img = await load_image(f"file://{tmp_path}/a.png", "f", limits)
    assert img.size == (6, 4)


@pytest.mark.parametrize(
    "url,code",
    [
        ("file:///etc/hostname", "local_media_not_allowed"),
        ("file://otherhost/x.png", "local_media_not_allowed"),
        ("gopher://x", None),
        ("data:image/png;base64,***", None),
        ("data:nocomma", None),
    ],
)
async def test_bad_urls_are_400_naming_the_field(tmp_path, url, code):
    with pytest.raises(APIError) as e:
        await fetch_bytes(url, "image_url", MediaLimits(allowed_local_media_path=tmp_path))
    assert e.value.status == 400 and e.value.param == "image_url" and e.value.code == code


async def test_file_urls_disabled_without_allowlist(tmp_path):
    (tmp_path / "a.png").write_bytes(_png())
    with pytest.raises(APIError) as e:
        await fetch_bytes(f"file://{tmp_path}/a.png", "image_url", MediaLimits())
    assert e.value.code == "local_media_not_allowed"


def test_size_and_pixel_limits():
    limits = MediaLimits(max_bytes=1000, max_image_pixels=100)
    with pytest.raises(APIError) as e:
        image_from_bytes(_png((20, 20)), "image", limits)  # 400 pixels > 100: refused before decoding
    assert e.value.status == 413
    big = base64.b64encode(os.urandom(2000)).decode()
    with pytest.raises(APIError) as e:
        asyncio.run(fetch_bytes("data:image/png;base64," + big, "image", limits))
    assert e.value.status == 413


def test_image_and_audio_round_trips():
    img = Image.fromarray(np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3))
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(encode_image(img, "png")))), np.asarray(img))
    assert Image.open(io.BytesIO(encode_image(img, "webp", 90))).format == "WEBP"
    assert Image.open(io.BytesIO(encode_image(img, "jpeg", 90))).format == "JPEG"
    t = np.linspace(0, 1, 1600, dtype=np.float32)
    wave = 0.5 * np.sin(2 * np.pi * 220 * t).astype(np.float32)
    for fmt in ("wav", "flac"):
        back, sr = audio_from_bytes(encode_audio(wave, 16000, fmt), "audio")
        assert sr == 16000 and np.max(np.abs(back - wave)) < 1e-4  # 16-bit quantisation only
    back, sr = sf.read(io.BytesIO(encode_audio(wave, 16000, "mp3")))
    assert sr == 16000 and abs(len(back) - len(wave)) < 2000  # lossy codec adds padding
    raw = np.frombuffer(pcm16(wave), dtype="<i2")
    assert len(raw) == len(wave) and np.max(np.abs(raw / 32768.0 - wave)) < 1e-4


def test_mp4_encode_odd_sizes():
    frames = np.zeros((3, 7, 9, 3), dtype=np.uint8)
    frames[:, :, :, 0] = 200
    with av.open(io.BytesIO(encode_mp4(frames, 8))) as c:
        decoded = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(decoded) == 3 and decoded[0].shape == (8, 10, 3)  # padded to even sides
    assert abs(int(decoded[0][3, 3, 0]) - 200) < 12


# --------------------------------------------------------------------------- storage


@pytest.mark.parametrize("name", ["../x", "..", "a/b", "/etc/passwd", "", ".hidden", "a\x00b", "x" * 200, "a/../../b"])
def test_storage_refuses_path_traversal(tmp_path, name):
    storage = MediaStore(StorageSettings(path=str(tmp_path / "s")))
    with pytest.raises(InvalidName):
        storage.key_for(name)


async def test_storage_save_open_delete(tmp_path):
    storage = MediaStore(StorageSettings(path=str(tmp_path)))
    await storage.start()
    await storage.save("video_1.mp4", b"abcdef")
    assert (tmp_path / "video_1.mp4").read_bytes() == b"abcdef" and await storage.size("video_1.mp4") == 6
    assert await storage.read("video_1.mp4") == b"abcdef" and await storage.read("video_1.mp4", 2, 4) == b"cd"
    assert await storage.delete("video_1.mp4") and await storage.size("video_1.mp4") is None
    assert not await storage.delete("video_1.mp4")


async def test_ttl_sweeper_deletes_expired_files(tmp_path):
    expired_names = []
    storage = MediaStore(
        StorageSettings(path=str(tmp_path), file_ttl=60, ttl_sweep_interval=1), on_expired=expired_names.extend
    )
    await storage.start()
    try:
        await storage.save("old.mp4", b"1")
        await storage.save("new.mp4", b"2")
        past = time.time() - 120
        os.utime(tmp_path / "old.mp4", (past, past))
        for _ in range(400):  # the sweeper runs every second (a loaded machine may delay it by seconds)
            if not (tmp_path / "old.mp4").exists():
                break
            await asyncio.sleep(0.05)
        assert not (tmp_path / "old.mp4").exists()
        assert (tmp_path / "new.mp4").exists() and expired_names == ["old.mp4"]
    finally:
        await storage.stop()


def test_settings_from_environment(monkeypatch):
    monkeypatch.setenv("OMNISTAGE_SERVER_STORAGE__FILE_TTL", "30")
    monkeypatch.setenv("OMNISTAGE_SERVER_STORAGE__FILE_CONCURRENCY", "2")
    s = ServerSettings()
    assert s.storage.file_ttl == 30 and s.storage.ttl_sweep_interval == 300 and s.storage.file_concurrency == 2
    monkeypatch.setenv("OMNISTAGE_SERVER_STORAGE__FILE_TTL", "soon")
    with pytest.raises(ValueError):
        ServerSettings()
