"""The cloned-voice registry (omnistage/server/voices.py) over the server's SQLite job store: voices
persist across a reopened store, list in registration order, delete, refuse duplicates, and bad names
and clips are 400s naming the field. The HTTP routes and their use on /v1/audio/speech are tested end
to end in tests/models/codec_tts/test_llasa_http.py."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile

from omnistage.server.errors import APIError
from omnistage.server.jobstore.sqlite_store import SqliteJobStore as JobStore
from omnistage.server.voices import Voice, VoiceRegistry, check_name, clip_from_bytes


def wav(seconds: float, rate: int = 16000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    soundfile.write(buf, (0.2 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def voice(name: str, data: bytes, created_at: int) -> Voice:
    samples, rate = clip_from_bytes(data, "audio", 30.0)
    return Voice(
        name=name,
        text=f"the words {name} says",
        data=data,
        sample_rate=rate,
        duration_s=samples.size / rate,
        created_at=created_at,
    )


async def test_voices_persist_list_and_delete(tmp_path):
    store = JobStore(tmp_path)
    await store.open()
    reg = VoiceRegistry(store)
    a, b = wav(1.0), wav(0.5, rate=24000)
    await reg.add(voice("anna", a, 100))
    await reg.add(voice("bob", b, 200))
    with pytest.raises(APIError) as e:
        await reg.add(voice("anna", b, 300))
    assert e.value.status == 409 and e.value.param == "name"
    await store.close()

    store = JobStore(tmp_path)  # a restarted server on the same storage path
    await store.open()
    again = VoiceRegistry(store)
    listed = await again.list()
    assert [v.name for v in listed] == ["anna", "bob"]
    anna = await again.get("anna")
    assert anna.data == a and anna.text == "the words anna says" and anna.duration_s == pytest.approx(1.0)
    samples, rate = anna.samples()
    ref, ref_rate = soundfile.read(io.BytesIO(a), dtype="float32")
    assert rate == ref_rate == 16000 and np.array_equal(samples, ref)
    assert (await again.get("bob")).sample_rate == 24000
    assert "audio" not in anna.public()  # listings never carry the clip
    assert await again.delete("anna") is True and await again.delete("anna") is False
    await store.close()

    store = JobStore(tmp_path)
    await store.open()
    assert [v.name for v in await VoiceRegistry(store).list()] == ["bob"]
    assert await store.load("video") == []  # voice rows are their own kind: the video jobs never see them
    await store.close()


@pytest.mark.parametrize("name", ["", "x y", "-lead", "a/b", "n" * 65, None, 3])
def test_bad_names_are_400_naming_name(name):
    with pytest.raises(APIError) as e:
        check_name(name)
    assert e.value.status == 400 and e.value.param == "name"


def test_good_names_pass():
    assert check_name("anna.v2_final-1") == "anna.v2_final-1"


@pytest.mark.parametrize(
    "data, why",
    [
        (b"not audio at all", "not decodable"),
        (wav(31.0), "at most 30 s"),
        (wav(0.0), "no samples"),
    ],
)
def test_bad_clips_are_400_naming_the_field(data, why):
    with pytest.raises(APIError) as e:
        clip_from_bytes(data, "ref_audio", 30.0)
    assert e.value.status == 400 and e.value.param == "ref_audio" and why in e.value.message
