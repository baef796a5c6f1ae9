"""Qwen3-Omni through the real HTTP server (``omnistage serve`` subprocess): chat with text and speech
(whole and streamed), usage, voices, speech, errors, transcriptions — against transformers' generate(). The server
(``omni_server``) is this package's (conftest.py)."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import openai
import pytest
import soundfile

from tests.models import omni_media as media
from tests.models import omni_transcripts
from tests.models.qwen_omni.conftest import TransformersReference

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

THINK, TALK = 12, 20
PROMPT = "hello, who are you?"
BODY = {
    "model": "tiny-omni",
    "messages": [{"role": "user", "content": PROMPT}],
    "temperature": 0,
    "max_tokens": THINK,
    "sampling_params_list": [None, {"temperature": 0, "max_tokens": TALK}],
}


@pytest.fixture(scope="module")
def ref(tiny_model):
    reference = TransformersReference(tiny_model("qwen3_omni"))
    run = reference.run([{"role": "user", "content": PROMPT}], THINK, TALK)
    return reference, run


STEP = 1 / 32767  # one 16-bit step (every format is round(x * 32768), media.to_int16; decoders divide by 32768)
FLOAT = 1e-5  # omnistage's float waveform vs transformers' (measured ~1e-6)


def expected_usage(reference: TransformersReference, run) -> dict:
    """OpenAI's usage of transformers' run: the thinker's prompt and reply, the prompt's media placeholder tokens
    (the processor's ids), the speech's codec frames (as code2wav got them)."""
    cfg = reference.model.config.thinker_config
    ids, frames = run.prompt_ids, int(run.codes.shape[-1])
    media = {k: ids.count(getattr(cfg, f"{k}_token_id")) for k in ("audio", "image")}
    return {
        "prompt_tokens": len(ids),
        "completion_tokens": len(run.reply),
        "total_tokens": len(ids) + len(run.reply),
        "prompt_tokens_details": {
            **{f"{k}_tokens": n for k, n in media.items()},
            "text_tokens": len(ids) - sum(media.values()),
        },
        "completion_tokens_details": {"text_tokens": len(run.reply), "audio_tokens": frames},
    }


def usage_without_cache(body: dict) -> dict:
    """The usage with ``cached_tokens`` checked and left out (it counts what earlier requests left in vLLM's
    prefix cache, so it depends on the test order)."""
    usage = json.loads(json.dumps(body["usage"]))
    cached = usage["prompt_tokens_details"].pop("cached_tokens")
    assert 0 <= cached <= usage["prompt_tokens"]
    return usage


def test_chat_returns_text_and_a_wav_within_one_16bit_step(omni_server, ref):
    reference, run = ref
    body = httpx.post(f"{omni_server}/v1/chat/completions", json=BODY, timeout=300).json()
    message = body["choices"][0]["message"]
    assert message["content"] == reference.tok.decode(run.reply, skip_special_tokens=True)
    audio = message["audio"]
    assert audio["format"] == "wav" and audio["transcript"] == message["content"]
    wav, rate = soundfile.read(io.BytesIO(base64.b64decode(audio["data"])), dtype="float32")  # int16 / 32768
    assert rate == 24000 and wav.shape == run.audio.shape
    assert np.abs(wav - np.clip(run.audio.numpy(), -1, 1)).max() <= STEP + FLOAT
    assert usage_without_cache(body) == expected_usage(reference, run)  # the thinker's tokens


def test_streamed_chat_interleaves_text_and_audio_deltas(omni_server, ref):
    reference, run = ref
    chunks = []
    with httpx.stream(
        "POST",
        f"{omni_server}/v1/chat/completions",
        timeout=300,
        json={**BODY, "stream": True, "stream_options": {"include_usage": True}},
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    text = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("modality") == "text" and c["choices"]
    )
    assert text == reference.tok.decode(run.reply, skip_special_tokens=True)
    audio = [c["choices"][0]["delta"]["audio"] for c in chunks if c.get("modality") == "audio"]
    assert len(audio) >= 3 and {a["format"] for a in audio} == {"pcm16"}
    assert audio[0]["sample_rate"] == 24000 and all("sample_rate" not in a for a in audio[1:])  # given once
    pcm = np.frombuffer(b"".join(base64.b64decode(a["data"]) for a in audio), dtype="<i2")
    assert pcm.shape == run.audio.shape
    assert np.abs(pcm / 32768.0 - np.clip(run.audio.numpy(), -1, 1)).max() <= STEP + FLOAT
    assert chunks[-1]["usage"]["completion_tokens"] == len(run.reply)


def test_a_thinker_that_stops_on_its_first_token_answers_its_text_without_audio(omni_server, ref):
    """Speech asked, but the thinker stops after one token (max_tokens=1): the talker, which needs the turn's first
    4 tokens, has nothing to speak. The answer is a 200 with that token's text, no audio part and the thinker's
    finish_reason, whole and streamed, read with the openai client."""
    reference, run = ref
    client = openai.OpenAI(base_url=f"{omni_server}/v1", api_key="unused", max_retries=0)
    ask = dict(
        model="tiny-omni",
        messages=[{"role": "user", "content": PROMPT}],
        temperature=0,
        max_tokens=1,
        modalities=["text", "audio"],
        extra_body={"sampling_params_list": [None, {"temperature": 0, "max_tokens": TALK}]},
    )
    text = reference.tok.decode(run.reply[:1], skip_special_tokens=True)  # greedy: the 12-token reply's first
    finish = "stop" if run.reply[0] == reference.tok.convert_tokens_to_ids("<|im_end|>") else "length"
    whole = client.chat.completions.create(**ask)
    assert whole.choices[0].message.content == text and whole.choices[0].message.audio is None
    assert whole.choices[0].finish_reason == finish
    chunks = list(client.chat.completions.create(**ask, stream=True))
    choices = [c.choices[0] for c in chunks if c.choices]
    assert "".join(c.delta.content or "" for c in choices) == text
    assert not [c for c in choices if getattr(c.delta, "audio", None) and c.delta.audio.get("data")]
    assert [c.finish_reason for c in choices if c.finish_reason] == [finish]


def test_text_only_modality_and_voices(omni_server):
    body = httpx.post(f"{omni_server}/v1/chat/completions", json={**BODY, "modalities": ["text"]}, timeout=300).json()
    assert "audio" not in body["choices"][0]["message"] and body["choices"][0]["message"]["content"]
    voices = httpx.get(f"{omni_server}/v1/audio/voices").json()
    assert voices["voices"] == ["Aiden", "Chelsie", "Ethan"]


def test_speech_route_speaks_with_the_chosen_voice(omni_server, ref):
    """The speech route's input is a user turn (as a chat's): the WAV is transformers' speech of the answer in the
    voice asked for, and another voice is other audio (transformers' too)."""
    reference, ethan = ref

    def speech(voice: str) -> np.ndarray:
        r = httpx.post(
            f"{omni_server}/v1/audio/speech",
            timeout=300,
            json={
                "model": "tiny-omni",
                "input": PROMPT,
                "voice": voice,
                "response_format": "wav",
                "temperature": 0,
                "max_tokens": THINK,
                "sampling_params_list": [None, {"temperature": 0, "max_tokens": TALK}],
            },
        )
        assert r.status_code == 200, r.text
        wav, rate = soundfile.read(io.BytesIO(r.content), dtype="float32")  # int16 / 32768
        assert rate == 24000
        return wav

    chelsie = reference.run([{"role": "user", "content": PROMPT}], THINK, TALK, speaker="Chelsie").audio.numpy()
    for voice, want in (("Chelsie", chelsie), ("Ethan", ethan.audio.numpy())):
        got = speech(voice)
        assert got.shape == want.shape and np.abs(got - np.clip(want, -1, 1)).max() <= STEP + FLOAT, voice
    # the two voices differ (transformers' two speeches: so the check above tells them apart)
    assert chelsie.shape != want.shape or np.abs(chelsie - want).max() > 0.01


def test_chat_audio_voice_picks_the_speaker(omni_server):
    """OpenAI's chat ``audio.voice`` (and ``speaker`` in extra_body) reach the talker: a voice other than the
    default gives other audio, and the two spellings give the same audio."""

    def audio(extra: dict) -> bytes:
        r = httpx.post(f"{omni_server}/v1/chat/completions", json={**BODY, **extra}, timeout=300)
        assert r.status_code == 200, r.text
        return base64.b64decode(r.json()["choices"][0]["message"]["audio"]["data"])

    chelsie = audio({"audio": {"voice": "Chelsie", "format": "wav"}})
    assert chelsie == audio({"extra_body": {"speaker": "chelsie"}})
    assert chelsie != audio({})  # the default voice is Ethan


@pytest.mark.parametrize(
    "body, param",
    [
        ({**BODY, "sampling_params_list": [None, {"speaker": "Bob"}]}, "speaker"),
        ({**BODY, "audio": {"voice": "Bob"}}, "audio.voice"),
        ({**BODY, "speaker": "Bob"}, "speaker"),
        ({**BODY, "sampling_params_list": [None, {"temprature": 0.1}]}, "temprature"),
        (
            {
                **BODY,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "input_audio", "input_audio": {"data": "bm90IGF1ZGlv", "format": "wav"}}],
                    }
                ],
            },
            "messages[0].content[0].input_audio",
        ),
    ],
)
def test_bad_input_is_a_400_naming_the_field(omni_server, body, param):
    r = httpx.post(f"{omni_server}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_bench_serve_omni_task_measures_text_and_speech(omni_server, tmp_path):
    """`omnistage bench serve --task omni`: streamed chat with modalities text + audio, one request hearing a clip
    (an input_audio part); every request completes with text tokens and audio, and the report carries TTFT, time to
    first audio packet and audio length."""
    from omnistage.bench.datasets import random_audio, wav_bytes
    from omnistage.cli.main import main as cli_main

    # a custom dataset, so the talker gets a frame budget (random weights rarely end speech on their own)
    talker = {"sampling_params_list": [None, {"temperature": 0, "max_tokens": TALK}]}
    (tmp_path / "question.wav").write_bytes(wav_bytes(random_audio(0.5, 0)))
    dataset = tmp_path / "omni.jsonl"
    dataset.write_text(
        json.dumps({"prompt": "hello there", "max_tokens": THINK, "extra": talker})
        + "\n"
        + json.dumps({"prompt": "what did i say?", "audio": "question.wav", "max_tokens": THINK, "extra": talker})
        + "\n"
    )
    out = tmp_path / "omni.json"
    rc = cli_main(
        [
            "bench",
            "serve",
            "--base-url",
            omni_server,
            "--model",
            "tiny-omni",
            "--task",
            "omni",
            "--dataset",
            "custom",
            "--dataset-path",
            str(dataset),
            "--num-prompts",
            "2",
            "--max-concurrency",
            "2",
            "--no-ignore-eos",
            "--temperature",
            "0",
            "--warmup-requests",
            "0",
            "--slo-scale",
            "0",
            "--disable-tqdm",
            "--no-plot",
            "--output-file",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    m = report["metrics"]
    assert rc == 0 and m["completed_requests"] == 2, report["requests"]
    assert m["ttft_mean_ms"] > 0 and m["audio_ttfp_mean"] > 0
    assert m["audio_duration_mean"] > 0 and m["audio_rtf_mean"] > 0


# ---------------------------------------------------------------------------------------------- media in


def wav_of(body: dict) -> np.ndarray:
    return soundfile.read(
        io.BytesIO(base64.b64decode(body["choices"][0]["message"]["audio"]["data"])), dtype="float32"
    )[0]


def same_text(ours: str, theirs: str) -> bool:
    """Random weights end replies inside a multi-byte character: vLLM's detokenizer holds back the incomplete bytes
    that tokenizer.decode renders as U+FFFD (the token ids themselves are compared through the usage and the speech)."""
    return ours.rstrip("\ufffd") == theirs.rstrip("\ufffd")


def media_reference(reference: TransformersReference, parts: list[dict], mm: dict, **kw):
    """transformers' generate() on the processor's inputs for one user turn of ``parts`` (typed for its template)."""
    kinds = {"input_audio": "audio", "audio_url": "audio", "image_url": "image", "video_url": "video"}
    turn = [{"type": kinds[p["type"]], kinds[p["type"]]: "x"} if p["type"] in kinds else p for p in parts]
    prompt = reference.processor.apply_chat_template(
        [{"role": "user", "content": turn}], add_generation_prompt=True, tokenize=False
    )
    return reference.run_inputs(dict(reference.processor(text=prompt, return_tensors="pt", **mm, **kw)), THINK, TALK)


CLIP, IMAGE = media.clip(1.0, 0), media.image(0)
WAV_URL = "data:audio/wav;base64," + media.wav_base64(CLIP)
MEDIA_CHATS = {  # what the client sends, and what the processor gets
    "input_audio": (
        [
            {"type": "input_audio", "input_audio": {"data": media.wav_base64(CLIP), "format": "wav"}},
            {"type": "text", "text": "what did i just say?"},
        ],
        {"audio": [CLIP]},
    ),
    "audio_url+image_url": (
        [
            {"type": "image_url", "image_url": {"url": media.png_url(IMAGE)}},
            {"type": "audio_url", "audio_url": {"url": WAV_URL}},
            {"type": "text", "text": "what do you see and hear?"},
        ],
        {"images": [IMAGE], "audio": [CLIP]},
    ),
}


@pytest.mark.parametrize("name", list(MEDIA_CHATS))
def test_chat_with_media_speaks_as_transformers(omni_server, ref, name):
    reference, _ = ref
    parts, mm = MEDIA_CHATS[name]
    run = media_reference(reference, parts, mm)
    r = httpx.post(
        f"{omni_server}/v1/chat/completions",
        timeout=300,
        json={**BODY, "messages": [{"role": "user", "content": parts}]},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert same_text(
        body["choices"][0]["message"]["content"], reference.tok.decode(run.reply, skip_special_tokens=True)
    )
    assert usage_without_cache(body) == expected_usage(reference, run)  # placeholders expanded as the processor does
    wav = wav_of(body)
    assert wav.shape == run.audio.shape and np.abs(wav - np.clip(run.audio.numpy(), -1, 1)).max() <= STEP + FLOAT


def test_chat_with_a_video_url_speaks_as_transformers(omni_server, ref):
    """A real MP4 (H.264, 2 fps: the processor's default rate, so both sides time the frames alike); the reference
    gets the frames PyAV decodes from the same file."""
    import av

    from tests.models.chat.mm_cases import mp4

    reference, _ = ref
    data = mp4(media.frames(4, 0), fps=2)
    with av.open(io.BytesIO(data)) as container:
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    parts = [
        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(data).decode()}},
        {"type": "text", "text": "what happens?"},
    ]
    run = media_reference(reference, parts, {"videos": [frames]})
    r = httpx.post(
        f"{omni_server}/v1/chat/completions",
        timeout=300,
        json={**BODY, "messages": [{"role": "user", "content": parts}]},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert same_text(
        body["choices"][0]["message"]["content"], reference.tok.decode(run.reply, skip_special_tokens=True)
    )
    wav = wav_of(body)
    assert wav.shape == run.audio.shape and np.abs(wav - np.clip(run.audio.numpy(), -1, 1)).max() <= STEP + FLOAT


@pytest.mark.parametrize(
    "part, status, param, says",
    [
        (
            {"type": "image_url", "image_url": {"url": media.png_url(media.image(1, size=128))}},
            413,
            "messages[0].content[1].image_url",
            "above this server's limit of 9216",
        ),  # --max-image-pixels
        (
            {
                "type": "audio_url",
                "audio_url": {"url": "data:audio/wav;base64," + base64.b64encode(b"RIFF junk").decode()},
            },
            400,
            "messages[0].content[1].audio_url",
            "not decodable audio",
        ),
    ],
)
def test_a_bad_or_oversized_media_part_is_refused_naming_it_and_the_server_keeps_serving(
    omni_server, part, status, param, says
):
    content = [{"type": "text", "text": "look"}, part]
    r = httpx.post(
        f"{omni_server}/v1/chat/completions",
        json={**BODY, "messages": [{"role": "user", "content": content}]},
        timeout=300,
    )
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param and says in r.json()["error"]["message"]
    parts, _ = MEDIA_CHATS["input_audio"]
    ok = httpx.post(
        f"{omni_server}/v1/chat/completions",
        json={**BODY, "messages": [{"role": "user", "content": parts}]},
        timeout=300,
    )
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["audio"]["data"]


def test_transcriptions_equal_transformers_and_the_talker_never_runs(omni_server, ref):
    reference, _ = ref
    omni_transcripts.check_transcripts(
        omni_server, "tiny-omni", omni_transcripts.expected(reference.processor, reference.model)
    )
    omni_transcripts.check_bad_language(omni_server, "tiny-omni")
