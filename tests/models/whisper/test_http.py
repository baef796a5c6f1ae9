"""``/v1/audio/transcriptions`` and ``/v1/audio/translations`` on the tiny ``whisper`` fixture, through the
official ``openai`` client: json, text and the SSE stream equal the family's offline output (the served
AsyncOmni's own ``generate``, asked first, on the windows vLLM's own ``split_audio`` cuts, as ``vllm serve``
does); verbose_json / srt / vtt give the segments Whisper's timestamp tokens mark inside each window — on the
65 s and 95 s clips in order, never overlapping, inside the clip, each from the window's own timestamped
tokens (the family's offline output asked for timestamps), srt and vtt the same segments; concurrent
requests equal solo ones; with no language, Whisper's detected one (transformers' ``detect_language``) and
transformers' timestamped segments; bad input is a 400 (413 for an oversized file) naming the field, and the
server keeps serving. (The segments' cut itself equals ``vllm serve``'s: test_vllm_serve_parity.py.)
"""

from __future__ import annotations

import asyncio
import io
import os
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf

from omnistage.testing.server import serve_engine
from tests.models.asr_cases import RATE, as_heard, clip, wav
from tests.models.whisper.cases import ENGINE, between_timestamps

pytestmark = pytest.mark.vllm

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

MAX_TOKENS = 12
MAX_MEDIA = 3 << 20
WINDOW_S = 30


SHORT = wav(clip(3.0, 2))  # (a seed whose outputs are text, not only special tokens, in every case)
LONG = wav(clip(65.0, 12))  # three windows of about 30 s
LONGEST = wav(clip(95.0, 13))  # four windows
OTHERS = [wav(clip(1.5 + k, 20 + k)) for k in range(4)]
# (file, language, task, prompt) -> expected window texts, filled offline before the server starts
CASES = [
    (SHORT, "en", "transcribe", ""),
    (LONG, "en", "transcribe", ""),
    (LONGEST, "en", "transcribe", ""),
    (SHORT, "de", "transcribe", ""),
    (SHORT, "en", "transcribe", "hello world"),
    (SHORT, "fr", "translate", ""),
] + [(o, "en", "transcribe", "") for o in OTHERS]


STAMPED = (LONG, LONGEST)  # clips whose windows are also asked for timestamps offline


def key(data: bytes, language: str = "en", task: str = "transcribe", prompt: str = "") -> tuple:
    return (CASES.index((data, language, task, prompt)),)


@pytest.fixture(scope="module")
def server(tiny_model):
    from omnistage import AsyncOmni

    with serve_engine(
        AsyncOmni(tiny_model("whisper"), **ENGINE),
        ready_timeout=300,
        served_model_name="tiny-whisper",
        max_media_bytes=MAX_MEDIA,
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def offline(server):
    """The family's own output per case: (start s, end s, text) per window, from the served AsyncOmni's own
    ``generate`` (on the server's loop, before any HTTP request: one engine for both); and per clip of STAMPED,
    ``("stamped", k)``: the token ids of each window asked for timestamps as the route asks
    (``Transcription.timestamps``)."""
    from vllm.multimodal.audio import split_audio

    engine = server.engine

    async def one(samples, language, task, prompt, timestamps=False):
        req = {
            "prompt": prompt,
            "multi_modal_data": {"audio": (samples, RATE)},
            "transcription": {"language": language, "task": task, "timestamps": timestamps},
        }
        last = None
        async for out in engine.generate(
            req, sampling_params_list=[{"max_tokens": MAX_TOKENS}], output_modalities=["text", "token_ids"]
        ):
            last = out
        return last.token_ids if timestamps else last.text or ""

    def pieces_of(data):
        samples = as_heard(data)
        return split_audio(samples, RATE, WINDOW_S, 1, 1600) if samples.size > WINDOW_S * RATE else [samples]

    async def run() -> dict:
        out = {}
        for i, (data, language, task, prompt) in enumerate(CASES):
            pieces = pieces_of(data)
            texts = await asyncio.gather(*(one(p, language, task, prompt) for p in pieces))
            ends = np.cumsum([p.size / RATE for p in pieces])
            out[(i,)] = [(end - p.size / RATE, end, text) for p, end, text in zip(pieces, ends, texts)]
        for k, data in enumerate(STAMPED):
            out["stamped", k] = await asyncio.gather(*(one(p, "en", "transcribe", "", True) for p in pieces_of(data)))
        return out

    return server.run(run(), timeout=600)


@pytest.fixture(scope="module")
def client(server, offline):  # the offline answers first: no HTTP request has reached the engine before them
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def transcribe(client, data, fmt="json", language="en", prompt="", **kw):
    extra = {"language": language} if language else {}
    if prompt:
        extra["prompt"] = prompt
    return client.audio.transcriptions.create(
        model="tiny-whisper",
        file=("clip.wav", data, "audio/wav"),
        response_format=fmt,
        extra_body={"max_tokens": MAX_TOKENS},
        **extra,
        **kw,
    )


def joined(data: bytes, offline, *case) -> str:
    return " ".join(text for _, _, text in offline[key(data, *case)])


def test_json_equals_offline(client, offline):
    for data in (SHORT, LONG):
        assert transcribe(client, data).text == joined(data, offline)
    long = offline[key(LONG)]
    assert len(long) == 3 and len({t for _, _, t in long}) == 3


def clock(seconds: float, sep: str) -> str:
    ms = round(seconds * 1000)
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}{sep}{ms % 1000:03d}"


def test_text_srt_vtt(client, offline):
    """text: the windows' texts; srt / vtt: the timestamped segments verbose_json gives for the same clip."""
    assert transcribe(client, LONG, "text") == joined(LONG, offline)
    assert clock(65.0, ",") == "00:01:05,000"
    w = [(s.start, s.end, s.text) for s in transcribe(client, LONG, "verbose_json").segments]
    bounds = [(a, b) for a, b, _ in offline[key(LONG)]]
    assert any(all(abs(a - x) + abs(b - y) > 1e-3 for x, y in bounds) for a, b, _ in w)  # not the windows' bounds
    assert transcribe(client, LONG, "srt") == "".join(
        f"{i + 1}\n{clock(a, ',')} --> {clock(b, ',')}\n{t.strip()}\n\n" for i, (a, b, t) in enumerate(w)
    )
    assert transcribe(client, LONG, "vtt") == "WEBVTT\n\n" + "".join(
        f"{clock(a, '.')} --> {clock(b, '.')}\n{t.strip()}\n\n" for a, b, t in w
    )


def is_sublist(part: list[int], whole: list[int]) -> bool:
    return any(whole[k : k + len(part)] == part for k in range(len(whole) - len(part) + 1))


@pytest.mark.parametrize("data, seconds, n", [(LONG, 65.0, 3), (LONGEST, 95.0, 4)])
def test_verbose_json_segments_inside_each_window(client, offline, data, seconds, n):
    """In order, never overlapping, inside the clip; each inside its window (``seek``: the window's start in
    10 ms frames), its tokens a run of that window's timestamped tokens; some not the whole window."""
    w = offline[key(data)]
    stamped = offline["stamped", STAMPED.index(data)]
    assert len(w) == len(stamped) == n
    out = transcribe(client, data, "verbose_json", timestamp_granularities=["segment"])
    assert out.language == "en" and out.duration == pytest.approx(seconds)
    segments = out.segments
    assert out.text == " ".join(s.text for s in segments)
    assert 0 <= segments[0].start and segments[-1].end <= seconds + 1e-3
    assert all(s.start <= s.end for s in segments)
    assert all(x.end <= y.start for x, y in zip(segments, segments[1:]))  # monotonic, non-overlapping
    starts = [round(a * 100) for a, _, _ in w]
    assert [s.id for s in segments] == list(range(len(segments)))
    assert sorted({s.seek for s in segments}) == starts  # every window has its segments, in window order
    for s in segments:
        k = starts.index(s.seek)
        a, b, _ = w[k]
        assert a - 1e-3 <= s.start <= s.end <= b + 1e-3
        assert is_sublist(s.tokens, stamped[k]) and s.avg_logprob is not None and s.avg_logprob <= 0
    inside = [
        s
        for s in segments
        if (s.start, s.end) != (pytest.approx(w[starts.index(s.seek)][0]), pytest.approx(w[starts.index(s.seek)][1]))
    ]
    assert inside  # times from the timestamp tokens, not the window's bounds


def test_stream_events(client, offline):
    for data in (SHORT, LONG):
        events = list(transcribe(client, data, stream=True))
        deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
        assert [e.type for e in events][-1] == "transcript.text.done"
        assert "".join(deltas) == events[-1].text == joined(data, offline)
        assert len(deltas) > 1  # streamed as generated, not in one piece


def test_language_prompt_and_translation(client, offline):
    assert transcribe(client, SHORT, language="de").text == joined(SHORT, offline, "de")
    assert transcribe(client, SHORT, prompt="hello world").text == joined(
        SHORT, offline, "en", "transcribe", "hello world"
    )
    out = client.audio.translations.create(
        model="tiny-whisper",
        file=("clip.wav", SHORT, "audio/wav"),
        extra_body={"language": "fr", "max_tokens": MAX_TOKENS},
    )
    assert out.text == joined(SHORT, offline, "fr", "translate")
    assert len({joined(SHORT, offline), joined(SHORT, offline, "de"), out.text}) == 3


DETECT = [SHORT, OTHERS[0], OTHERS[1]]  # clips of one window each


@pytest.fixture(scope="module")
def hf_detected(tiny_model):
    """transformers' Whisper with no language, per clip of DETECT: ``detect_language``'s code, and the
    segments of the greedy ``generate(return_timestamps=True)`` that detects first, as (start, end, token ids)
    (``max_initial_timestamp_index=0``: it writes the ``<|0.00|>`` the route's prompt ends with, see
    tests/models/whisper/test_whisper_timestamps.py). ``task`` given: without it transformers leaves
    ``<|transcribe|>`` out of the prompt, which openai-whisper (and ``vllm serve``) put in."""
    import copy

    import torch
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    torch.set_num_threads(1)
    proc = WhisperProcessor.from_pretrained(tiny_model("whisper"))
    model = WhisperForConditionalGeneration.from_pretrained(tiny_model("whisper")).eval()
    config = copy.deepcopy(model.generation_config)
    config.max_initial_timestamp_index = 0
    out = []
    for data in DETECT:
        feats = proc(as_heard(data), sampling_rate=RATE, return_tensors="pt").input_features
        with torch.no_grad():
            token = proc.tokenizer.convert_ids_to_tokens(int(model.detect_language(feats)[0]))
            cut = model.generate(
                feats,
                generation_config=config,
                task="transcribe",
                do_sample=False,
                max_new_tokens=MAX_TOKENS + 1,
                return_timestamps=True,
                force_unique_generate_call=True,
                return_segments=True,
            )
        segments = [(float(s["start"]), float(s["end"]), s["tokens"].tolist()) for s in cut["segments"][0]]
        out.append((token[2:-2], segments))
    return out, config.no_timestamps_token_id + 1, config.eos_token_id


def test_language_detected_as_whisper_does(client, hf_detected):
    """No ``language``: the one Whisper detects (transformers' ``detect_language``), reported in
    verbose_json, and the transcript in it: json as with that language given, verbose_json's segments
    transformers' (timestamped ``generate`` without a language; times past the clip held at its end)."""
    cases, begin, eos = hf_detected
    for data, (language, theirs) in zip(DETECT, cases):
        out = transcribe(client, data, "verbose_json", language=None)
        assert out.language == language
        seconds = as_heard(data).size / RATE
        first = theirs[0][2]
        assert first[0] == begin  # transformers' segments start at the <|0.00|> it was made to write
        if len(theirs) > 1 or first[-2] >= begin <= first[-1]:  # cut at timestamp pairs
            assert [(s.start, s.end, s.tokens) for s in out.segments] == [
                (pytest.approx(min(a, seconds)), pytest.approx(min(b, seconds)), between_timestamps(t, begin))
                for a, b, t in theirs
            ]
        else:  # no pair: the window is one segment, its ids (transformers' after the <|0.00|>; with the end token)
            assert len(out.segments) == 1
            ids = out.segments[0].tokens
            assert (ids[:-1] if ids[-1] == eos else ids) == first[1:]
        assert transcribe(client, data, language=None).text == transcribe(client, data, language=language).text
    assert {language for language, _ in cases} - {"en"}  # detected, not the default


def test_other_formats_and_rates_decode(client):
    """A 44.1 kHz stereo FLAC and an MP3 of the same clip: decoded, resampled to 16 kHz, transcribed."""
    stereo = np.stack([clip(4.0, 5, 44100), clip(4.0, 6, 44100)], axis=1)
    for fmt in ("FLAC", "MP3"):
        buf = io.BytesIO()
        sf.write(buf, stereo, 44100, format=fmt)
        out = transcribe(client, buf.getvalue())
        assert out.text and out.usage.seconds == pytest.approx(4.0, abs=0.1)


def test_concurrent_requests_equal_solo(client, offline):
    files = OTHERS + [LONG, SHORT, LONGEST, wav(clip(2.0, 30))]
    assert len(files) == 8
    solo = [transcribe(client, d).text for d in files]
    assert solo[:7] == [joined(d, offline) for d in files[:7]]
    with ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(lambda d: transcribe(client, d).text, files))
    assert texts == solo


@pytest.mark.parametrize(
    "fields, files, param, status",
    [
        ({"response_format": "xml"}, None, "response_format", 400),
        ({"language": "xx"}, None, "language", 400),
        ({}, {"file": ("a.wav", b"this is not audio", "audio/wav")}, "file", 400),
        ({}, {"file": ("a.wav", b"\0" * (MAX_MEDIA + 10), "audio/wav")}, "file", 413),
        ({"stream": "true", "response_format": "srt"}, None, "stream", 400),
        (
            {"timestamp_granularities[]": "word", "response_format": "verbose_json"},
            None,
            "timestamp_granularities",
            400,
        ),
        ({"temperature": "-1"}, None, "temperature", 400),
        ({"max_tokens": "many"}, None, "max_tokens", 400),
        ({"colour": "red"}, None, "colour", 400),
        ({"model": "whisper-1"}, None, "model", 404),
    ],
)
def test_bad_input_names_the_field(server, client, offline, fields, files, param, status):
    data = {"model": "tiny-whisper", **fields}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        r = http.post("/v1/audio/transcriptions", data=data, files=files or {"file": ("a.wav", SHORT, "audio/wav")})
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param
    assert transcribe(client, SHORT).text == joined(SHORT, offline)  # the server keeps serving


def test_not_multipart_is_415(server):
    with httpx.Client(base_url=server.url, timeout=60) as http:
        r = http.post("/v1/audio/transcriptions", json={"model": "tiny-whisper"})
    assert r.status_code == 415


def test_bench_asr_task_sends_what_the_official_client_sends(server, client):
    """``omnistage bench serve --task asr``'s request function: every clip's text equals the openai client's
    transcription of the same WAV, and the RTF is latency over the clip's seconds."""
    from omnistage.bench.datasets import DatasetDefaults, random_dataset
    from omnistage.bench.request_funcs import ClientSpec
    from omnistage.bench.runner import RunConfig, run_benchmark

    reqs = random_dataset("asr", 3, DatasetDefaults(seed=5, chat_audio_s=2.0))
    for r in reqs:
        r.extra = {"language": "en", "max_tokens": MAX_TOKENS}
    run = asyncio.run(
        run_benchmark(
            ClientSpec(base_url=server.url, task="asr", model="tiny-whisper"),
            reqs,
            RunConfig(max_concurrency=3, warmup_requests=0, slo_scale=0, progress=False),
        )
    )
    for req, out in zip(reqs, run.outcomes):
        assert out.result.success, out.result.error
        assert out.outputs[0][1].decode() == transcribe(client, req.audio).text
        assert out.result.audio_duration == pytest.approx(2.0)
        assert out.result.audio_rtf == pytest.approx(out.result.latency / 2.0)
