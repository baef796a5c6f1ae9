"""speech_chat end to end over HTTP: a clip in an ``input_audio`` part -> Whisper -> chat LM -> codec_tts.

Every stage's output is checked against that stage's model run alone on the same input, after the speech_chat
server has stopped: the reply equals transformers' greedy chat answer (chat template, ``generate``) to
transformers' Whisper transcript of the clip (the whisper and chat families equal those references token for
token in their own tests), and the audio equals the codec_tts pipeline's answer to the reply (within one 16-bit
step: the HTTP answer is PCM16). Bad input is checked on the server (which keeps serving). Offline ``Omni`` runs
of this pipeline are left out on purpose (three more engine starts in a suite near its time budget): ``Omni`` is
``AsyncOmni`` driven synchronously, covered by tests/engine/test_offline_api.py.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import io
import json
import wave

import numpy as np
import pytest
import torch

from omnistage import AsyncOmni, Omni
from tests.models.asr_cases import TransformersWhisper

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

RATE = 16000
STEP = 1 / 32768  # one 16-bit step
ASR = {"temperature": 0.0, "max_tokens": 12}
CHAT = {"temperature": 0.0, "max_tokens": 8, "ignore_eos": True}
TTS = {"temperature": 0, "repetition_penalty": 1.0, "max_tokens": 24, "min_tokens": 24}
PARAMS = [ASR, CHAT, TTS, None]
KV = {"kv_cache_memory_bytes": 32 << 20, "enforce_eager": True}


def clip_pcm16(seconds: float = 2.0, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * RATE)) / RATE
    x = 0.3 * np.sin(2 * np.pi * 440.0 * t) + 0.05 * rng.standard_normal(t.size)
    return np.round(x * 32767).astype(np.int16)


def wav_bytes(pcm: np.ndarray) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def wav_samples(data: bytes) -> np.ndarray:
    with wave.open(io.BytesIO(data)) as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).astype(np.float32) / 32768


PCM = clip_pcm16()
SAMPLES = PCM.astype(np.float32) / 32768  # what any decoder makes of the 16-bit clip
MESSAGES = [
    {
        "role": "user",
        "content": [
            {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav_bytes(PCM)).decode(), "format": "wav"}}
        ],
    }
]


@pytest.fixture(scope="module")
def folders(tiny_model):
    return {"whisper": tiny_model("whisper"), "chat": tiny_model("chat"), "tts": tiny_model("codec_tts")}


def deploy(folders):
    models = [folders["whisper"], folders["chat"], folders["tts"], folders["tts"]]
    stages = [
        {
            "stage_id": i,
            "model": str(m),
            **(KV if i < 3 else {}),
            **({"max_model_len": 448} if i == 0 else {}),
            **({"max_model_len": 512} if i in (1, 2) else {}),
        }
        for i, m in enumerate(models)
    ]
    return {"pipeline": "speech_chat", "stages": stages}


def sse_events(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]


@pytest.fixture(scope="module")
def served(folders, server_factory):
    """Everything the speech_chat server answered, then the server stops (the references need the cores)."""
    engine = AsyncOmni(pipeline="speech_chat", deploy_config=deploy(folders), dtype="float32")
    srv = server_factory(engine, ready_timeout=300)
    body = {
        "model": "speech_chat",
        "messages": MESSAGES,
        "modalities": ["text", "audio"],
        "sampling_params_list": PARAMS,
    }
    got = {}
    with srv.client(timeout=120) as c:
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        got["whole"] = r.json()["choices"][0]["message"]
        got["whole_finish"] = r.json()["choices"][0]["finish_reason"]
        r = c.post("/v1/chat/completions", json={**body, "stream": True})
        assert r.status_code == 200, r.text
        got["stream"] = sse_events(r.text)
        r = c.post("/v1/chat/completions", json={**body, "modalities": ["text"]})
        got["text_only"] = r.json()["choices"][0]["message"]
        got["bad"] = {
            "no_audio": c.post("/v1/chat/completions", json={**body, "messages": [{"role": "user", "content": "hi"}]}),
            "not_audio": c.post(
                "/v1/chat/completions",
                json={
                    **body,
                    "messages": [
                        {
                            "role": "user",
                            "content": [
                                {
                                    "type": "input_audio",
                                    "input_audio": {"data": base64.b64encode(b"not audio").decode(), "format": "wav"},
                                }
                            ],
                        }
                    ],
                },
            ),
            "too_long": c.post(
                "/v1/chat/completions",
                json={
                    **body,
                    "messages": [
                        {
                            "role": "user",
                            "content": [
                                {
                                    "type": "input_audio",
                                    "input_audio": {
                                        "data": base64.b64encode(wav_bytes(clip_pcm16(31.0))).decode(),
                                        "format": "wav",
                                    },
                                }
                            ],
                        }
                    ],
                },
            ),
        }
        r = c.post("/v1/chat/completions", json=body)  # still serving after the bad requests
        got["after"] = r.json()["choices"][0]["message"]
    got["realtime"] = asyncio.run(realtime_turn(srv.url))
    srv.stop()
    return got


async def realtime_turn(url: str):
    """The clip spoken into /v1/realtime (PCM16 appended in 0.1 s pieces, committed), one response: the official
    client's events."""
    from tests.server.realtime_client import b64, next_event, openai_client, read_reply

    session = {
        "type": "realtime",
        "extra_body": {"sampling_params_list": PARAMS},
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": RATE}, "turn_detection": None}},
    }
    async with openai_client(url, "sk-any").realtime.connect(model="speech_chat") as conn:
        await next_event(conn, "session.created")
        await conn.session.update(session=session)
        await next_event(conn, "session.updated")
        pcm = PCM.astype("<i2").tobytes()
        for i in range(0, len(pcm), 3200):
            await conn.input_audio_buffer.append(audio=b64(pcm[i : i + 3200]))
        await conn.input_audio_buffer.commit()
        await next_event(conn, "input_audio_buffer.committed")
        await conn.response.create()
        return await read_reply(conn)


def test_bad_input_is_a_400_naming_the_part(served):
    bad = served["bad"]
    assert bad["no_audio"].status_code == 400 and "messages" in bad["no_audio"].json()["error"]["message"]
    assert bad["not_audio"].status_code == 400
    assert "messages[0].content[0]" in bad["not_audio"].json()["error"]["message"]
    assert bad["too_long"].status_code == 400 and "messages[0].content[0]" in bad["too_long"].json()["error"]["message"]
    assert served["after"]["content"] == served["whole"]["content"]


def chat_reply(folder, transcript: str) -> str:
    """transformers' greedy generate on the chat template's prompt; no EOS stop, as ``ignore_eos`` asks."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = tok.apply_chat_template(
        [{"role": "user", "content": transcript}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = None
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            generation_config=config,
            do_sample=False,
            max_new_tokens=CHAT["max_tokens"],
            pad_token_id=tok.pad_token_id or 0,
        )
    return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def test_each_stage_equals_its_family_alone(served, folders):
    reply = served["whole"]["content"]
    audio = wav_samples(base64.b64decode(served["whole"]["audio"]["data"]))
    assert reply and audio.size
    # 1. the recogniser alone on the clip: transformers' Whisper, greedy (the whisper family equals it token for
    # token, tests/models/whisper/test_whisper_vllm.py)
    transcript = TransformersWhisper(folders["whisper"]).transcript(SAMPLES, "en", ASR["max_tokens"]).strip()
    assert transcript
    # 2. the chat model alone, greedy, on the transcript: transformers' generate on the chat template's prompt
    assert reply == chat_reply(folders["chat"], transcript)
    assert served["text_only"]["content"] == reply and served["text_only"].get("audio") is None
    # 3. the TTS family alone on the reply
    with Omni(str(folders["tts"]), max_model_len=512, dtype="float32", **KV) as tts:
        spoken = tts.generate({"prompt": reply.strip()}, sampling_params_list=[TTS, None])[0]
    expected = np.asarray(spoken.audio, dtype=np.float32).reshape(-1)
    assert audio.shape == expected.shape
    # PCM16 holds [-1, 1 - 1/32768]: the random tiny codec overshoots, and the answer clips as any PCM16 does
    assert np.abs(audio - np.clip(expected, -1.0, 1 - STEP)).max() <= STEP


def test_streamed_equals_whole(served):
    events = served["stream"]
    text = "".join(
        e["choices"][0]["delta"].get("content") or ""
        for e in events
        if e.get("choices") and isinstance(e["choices"][0]["delta"].get("content"), str)
    )
    pcm = b"".join(
        base64.b64decode(e["choices"][0]["delta"]["audio"]["data"])
        for e in events
        if e.get("choices") and "audio" in e["choices"][0]["delta"]
    )
    assert text == served["whole"]["content"]
    streamed = np.frombuffer(pcm, dtype=np.int16).astype(np.float32) / 32768
    whole = wav_samples(base64.b64decode(served["whole"]["audio"]["data"]))
    assert streamed.shape == whole.shape
    assert np.abs(streamed - whole).max() <= STEP + 1e-7


def test_a_spoken_realtime_turn_is_answered_as_the_chat_route_answers_it(served):
    """The pipeline of three families serves /v1/realtime as it serves the chat route: the same clip spoken
    into a realtime session gets the chat answer's text and, PCM16 to PCM16, its audio."""
    reply, whole = served["realtime"], served["whole"]
    # OpenAI's Realtime rule: a reply cut at its token limit is "incomplete", as the chat route says "length"
    assert reply.status == {"stop": "completed", "length": "incomplete"}[served["whole_finish"]]
    assert not reply.errors
    assert reply.text == whole["content"] and reply.transcript_done == whole["content"]
    spoken = np.frombuffer(reply.pcm, dtype="<i2").astype(np.float32) / 32768
    audio = wav_samples(base64.b64decode(whole["audio"]["data"]))
    assert spoken.shape == audio.shape and np.abs(spoken - audio).max() <= STEP + 1e-7
