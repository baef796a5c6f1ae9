"""VibeVoice (tiny random-weight fixture, ``python -m omnistage.testing.tiny vibevoice``) against transformers'
own ``VibeVoiceForConditionalGeneration.generate`` in this process: the same script, ``torch.manual_seed(seed)``
before ``generate`` and ``seed`` on the request. Offline (streamed, one delta per frame, == the whole answer;
three concurrent requests share steps, each within 1e-5 of its solo run relative to the peak) and over HTTP
(``/v1/audio/speech`` within one 16-bit step, streamed == whole; ``/v1/chat/completions`` speaks the last user
message; bad params are a 400). Voice prompts: ``ref_audio`` (or a
registered voice) is the first speaker's clip, equal to transformers given the same clip through the folder's
``VibeVoiceProcessor``, offline and over HTTP."""

from __future__ import annotations

import asyncio
import base64
import io

import httpx
import numpy as np
import openai
import pytest
import pytest_asyncio
import soundfile
import torch

from omnistage import AsyncOmni
from omnistage.models.vibevoice.config import script_turns
from omnistage.testing.server import serve_engine
from omnistage.testing.streams import all_outputs
from omnistage.testing.tiny import build

torch.set_num_threads(1)

STEP = 1 / 32768  # one 16-bit step


def rel_diff(a: np.ndarray, ref: np.ndarray) -> float:
    """max |a - ref| over max |ref| (the tiny fixture's audio peaks near 0.15)."""
    assert a.shape == ref.shape
    return float(np.abs(a - ref).max() / np.abs(ref).max())


SOLO = "hello world"
DIALOGUE = "Speaker 1: hello there\nSpeaker 2: how are you today?"
RATE = 24000
# a voice clip on 16-bit levels (a WAV upload decodes to the same samples): 200 samples, 25 encoder frames
VOICE = np.round(3000 * np.sin(np.arange(200) / 5) + 300 * np.random.default_rng(0).standard_normal(200)) / 32768
VOICE = VOICE.astype(np.float32)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build("vibevoice", tmp_path_factory.mktemp("vibevoice"))


@pytest.fixture(scope="module")
def reference(folder):
    """transformers' generation: script -> (new token ids, audio), per seed; with ``voice``, that clip is the
    first speaker's voice sample through the folder's ``VibeVoiceProcessor``."""
    from transformers import AutoProcessor, AutoTokenizer, VibeVoiceForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(folder)
    processor = AutoProcessor.from_pretrained(folder)
    model = VibeVoiceForConditionalGeneration.from_pretrained(folder).eval()
    cache = {}

    def run(script: str, seed: int, max_new_tokens: int | None = None, voice: bool = False, **gen):
        key = script, seed, max_new_tokens, voice, tuple(sorted(gen.items()))
        if key not in cache:
            turns = script_turns(script)
            if voice:
                conv = [
                    {
                        "role": s,
                        "content": [{"type": "text", "text": t}]
                        + ([{"type": "audio", "audio": VOICE}] if i == 0 else []),
                    }
                    for i, (s, t) in enumerate(turns)
                ]
                ids = processor.apply_chat_template(conv, tokenize=True, return_dict=True, return_tensors="pt")
            else:
                conv = [{"role": s, "content": t} for s, t in turns]
                ids = tok.apply_chat_template(conv, tokenize=True, return_dict=True, return_tensors="pt")
            torch.manual_seed(seed)
            out = model.generate(**ids, return_dict_in_generate=True, max_new_tokens=max_new_tokens, **gen)
            cache[key] = (out.sequences[0, ids["input_ids"].shape[1] :].tolist(), out.audio[0].reshape(-1).numpy())
        return cache[key]

    run.audio_bos = model.config.audio_bos_token_id
    run.audio_token = model.config.audio_token_id
    return run


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def omni(folder):
    engine = AsyncOmni(str(folder))
    await engine.start()
    yield engine
    await engine.shutdown()


async def speak(omni, script, seed, voice=False, **params):
    prompt = {"prompt": script, "speech": {"ref_audio": (VOICE, RATE)}} if voice else script
    outs = await all_outputs(omni.generate(prompt, sampling_params_list=[{"seed": seed, **params}]))
    final = outs[-1]
    assert final.finished and final.error is None and final.sample_rate == 24000, final.error
    deltas = [np.asarray(o.delta["audio"]) for o in outs if not o.finished and o.delta.get("audio") is not None]
    return deltas, np.asarray(final.audio)


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("script, seed", [(SOLO, 3), (DIALOGUE, 3), (DIALOGUE, 11)])
async def test_offline_equals_transformers_and_streams_frame_by_frame(omni, reference, script, seed):
    tokens, ref = reference(script, seed)
    frames = tokens.count(reference.audio_token)
    assert frames >= 2
    if seed == 3:  # the fixture's rows make these scripts restart a speech segment: that path is compared too
        assert reference.audio_bos in tokens
    deltas, audio = await speak(omni, script, seed)
    assert rel_diff(audio, ref) <= 1e-6  # measured 0.0
    assert len(deltas) == frames  # each frame's audio as soon as it is decoded
    assert np.array_equal(np.concatenate(deltas), audio)


@pytest.mark.asyncio(loop_scope="module")
async def test_max_tokens_is_max_new_tokens(omni, reference):
    tokens, ref = reference(DIALOGUE, 3, 3)
    assert len(tokens) == 3 and tokens[-1] == reference.audio_token  # cut inside the speech: the last frame sounds
    _, audio = await speak(omni, DIALOGUE, 3, max_tokens=3)
    assert rel_diff(audio, ref) <= 1e-6


# the second has a voice prompt (ref_audio: the first speaker's clip); the third differs in guidance and diffusion
# steps (the batched diffusion head runs mixed groups)
CONCURRENT = [
    (SOLO, 3, False, {}),
    (DIALOGUE, 11, True, {"max_tokens": 8}),
    (DIALOGUE, 3, False, {"guidance_scale": 2.0, "num_diffusion_steps": 3}),
]


@pytest.mark.asyncio(loop_scope="module")
async def test_three_concurrent_requests_share_steps_and_equal_their_solo_runs(omni, reference):
    solo = []
    for script, seed, voice, gen in CONCURRENT:
        _, audio = await speak(omni, script, seed, voice, **gen)
        kw = {k: v for k, v in gen.items() if k != "max_tokens"}
        tokens, ref = reference(script, seed, gen.get("max_tokens"), voice, **kw)
        assert tokens.count(reference.audio_token) >= 3
        assert rel_diff(audio, ref) <= 1e-6  # measured 0.0
        solo.append(audio)
    assert not np.array_equal(reference(DIALOGUE, 11, 8)[1], reference(DIALOGUE, 11, 8, True)[1])  # the voice counts
    stage = omni.replicas(0)[0]
    before = len(stage.batch_sizes)
    together = await asyncio.gather(*(speak(omni, s, seed, v, **gen) for s, seed, v, gen in CONCURRENT))
    assert max(list(stage.batch_sizes)[before:]) == 3  # their LM, diffusion and decoder work shared steps
    for (_, audio), alone in zip(together, solo):
        assert rel_diff(audio, alone) <= 1e-5  # qwen3_tts's bar; measured 3e-7 (float rounding of batched matmuls)


@pytest.fixture(scope="module")
def url(folder, tmp_path_factory):
    from omnistage.config.settings import ServerSettings

    settings = ServerSettings(storage={"path": str(tmp_path_factory.mktemp("vibevoice-storage"))})  # voices
    server = serve_engine(AsyncOmni(str(folder)), settings, ready_timeout=300)
    yield server.url
    server.stop()


def pcm(resp: httpx.Response) -> np.ndarray:
    assert resp.status_code == 200, resp.text
    return np.frombuffer(resp.content, dtype="<i2")


def within_one_step(samples: np.ndarray, ref: np.ndarray) -> None:
    assert samples.shape == ref.shape
    assert np.abs(samples.astype(np.float64) * STEP - ref).max() <= STEP * 1.01


def test_speech_over_http_within_one_step_and_streamed_equals_whole(url, reference):
    body = {"input": DIALOGUE, "response_format": "pcm", "seed": 3}
    with httpx.Client(base_url=url, timeout=120) as http:
        whole = pcm(http.post("/v1/audio/speech", json=body))
        with http.stream("POST", "/v1/audio/speech", json={**body, "stream": True}) as r:
            assert r.status_code == 200 and r.headers["x-sample-rate"] == "24000"
            streamed = np.frombuffer(b"".join(r.iter_raw()), dtype="<i2")
    within_one_step(whole, reference(DIALOGUE, 3)[1])
    assert np.array_equal(streamed, whole)


def test_voice_prompt_over_http_inline_and_registered_equals_transformers(url, reference):
    buf = io.BytesIO()
    soundfile.write(buf, VOICE, RATE, format="WAV", subtype="PCM_16")  # VOICE is on 16-bit levels: exact
    wav = buf.getvalue()
    body = {"input": DIALOGUE, "response_format": "pcm", "seed": 11, "max_tokens": 8}
    with httpx.Client(base_url=url, timeout=120) as http:
        inline = pcm(
            http.post(
                "/v1/audio/speech",
                json={**body, "ref_audio": "data:audio/wav;base64," + base64.b64encode(wav).decode()},
            )
        )
        r = http.post(
            "/v1/audio/voices",
            data={"name": "mine", "text": "not needed by VibeVoice"},
            files={"audio": ("clip.wav", wav, "audio/wav")},
        )
        assert r.status_code == 200, r.text
        registered = pcm(http.post("/v1/audio/speech", json={**body, "voice": "mine"}))
    within_one_step(inline, reference(DIALOGUE, 11, 8, True)[1])
    assert np.array_equal(registered, inline)


def test_chat_speaks_the_last_user_message(url, reference):
    resp = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0).chat.completions.create(
        model="vibevoice",
        messages=[{"role": "user", "content": "not this"}, {"role": "user", "content": SOLO}],
        modalities=["audio"],
        extra_body={"seed": 3},
    )
    audio, rate = soundfile.read(io.BytesIO(base64.b64decode(resp.choices[0].message.audio.data)), dtype="int16")
    assert rate == 24000
    within_one_step(audio, reference(SOLO, 3)[1])


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"temperature": 0.7}, "temperature"),
        ({"voice": "alice"}, "voice"),
        ({"input": "Speaker 1:   "}, "input"),
        ({"sampling_params_list": [{"num_diffusion_steps": 10**6}]}, "num_diffusion_steps"),
        ({"max_tokens": 10**6}, "max_tokens"),
    ],
)
def test_bad_requests_are_400_naming_the_field(url, extra, param):
    resp = httpx.post(f"{url}/v1/audio/speech", json={"input": SOLO, **extra}, timeout=60)
    assert resp.status_code == 400, resp.text
    assert param in resp.json()["error"]["message"]
