"""`omnistage bench realtime` against a real server (uvicorn in this process) serving the test omni pipeline
(word-by-word ``llm`` stage + streamed tone stage, tests/server/pipelines.py): every session's turns are
answered, each answer holds the audio /v1/chat/completions returns for the same audio turn, a server-VAD turn
counts VAD's silence wait in its end-of-speech latency, and nothing keeps running after the barge-ins."""

from __future__ import annotations

import json
import time

import pytest

from omnistage import AsyncOmni
from omnistage.bench.utterance import utterance
from omnistage.cli.main import main as cli_main
from tests.server.pipelines import SAMPLE_RATE, talking_pipeline
from tests.server.realtime_client import b64, chat_stream

KEY = "sk-bench-realtime"


@pytest.fixture(scope="module")
def srv(server_factory):
    return server_factory(AsyncOmni(pipeline=talking_pipeline()), api_key=KEY)


def bench(srv, tmp_path, *args: str) -> tuple[int, dict, str]:
    out = tmp_path / "realtime.json"
    rc = cli_main(
        [
            "bench",
            "realtime",
            "--base-url",
            srv.url,
            "--api-key",
            KEY,
            "--speech-seconds",
            "0.5",
            "--output-file",
            str(out),
            *args,
        ]
    )
    return rc, json.loads(out.read_text()), out.with_suffix(".md").read_text()


def idle(srv) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if all(s.running == 0 and s.queue_depth == 0 for s in srv.engine.stage_stats().values()):
            return True
        time.sleep(0.02)
    return False


def test_manual_turns_at_two_concurrencies(srv, tmp_path):
    import io

    import soundfile

    rc, doc, table = bench(srv, tmp_path, "--concurrency", "1,2", "--turns", "2")
    assert rc == 0
    # the reference: the chat route's answer to an audio turn (the word stage answers any audio with "echo")
    clip, _ = utterance(0.5, 16000, after_s=0.1)
    buf = io.BytesIO()
    soundfile.write(buf, clip, 16000, format="WAV", subtype="PCM_16")
    _, pcm = chat_stream(
        srv.url,
        KEY,
        [
            {
                "role": "user",
                "content": [{"type": "input_audio", "input_audio": {"data": b64(buf.getvalue()), "format": "wav"}}],
            }
        ],
        modalities=["text", "audio"],
    )
    answer_s = len(pcm) / 2 / SAMPLE_RATE
    assert answer_s > 0
    assert [lv["concurrency"] for lv in doc["levels"]] == [1, 2]
    for lv in doc["levels"]:
        c = lv["concurrency"]
        assert not lv["failed_sessions"] and lv["turn_errors"] == []
        assert lv["turns"] == lv["turns_answered"] == 2 * c
        assert lv["audio_s_per_answer"]["max"] == lv["audio_s_per_answer"]["mean"] == answer_s
        assert 0 < lv["first_audio_s"]["median"] <= lv["first_audio_s"]["max"] < lv["wall_s"]
        assert lv["audio_rtf"]["median"] > 0
        assert lv["first_audio_turn1_s"]["median"] > 0 and lv["http_first_audio_s"]["median"] > 0  # the baseline
        assert lv["barge_ins"] == c  # one cancel per session, sent on its first audio delta
        for t in lv["per_turn"]:
            if t["kind"] == "barge_in" and t["status"] == "cancelled":
                assert 0 <= t["barge_in_s"] <= t["cancel_done_s"]
    assert idle(srv)
    assert table.count("\n| ") == 2 + 1  # header row and one row per level


def test_a_server_vad_turn_counts_the_silence_wait(srv, tmp_path):
    rc, doc, _ = bench(
        srv, tmp_path, "--concurrency", "1", "--turns", "1", "--no-barge-in", "--turn-detection", "server_vad"
    )
    assert rc == 0
    (lv,) = doc["levels"]
    assert lv["turns_answered"] == 1 and lv["barge_ins"] == 0 and lv["http_first_audio_s"] is None
    # end of speech -> first audio includes server VAD's silence_duration_ms (500 ms by default) less what its
    # 30 ms frames and the 100 ms appends round off (a lower bound only: the answer's own time is the machine's)
    assert 0.3 < lv["first_audio_s"]["median"] < lv["wall_s"]


def test_bad_arguments_are_refused(srv, tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli_main(["bench", "realtime", "--base-url", srv.url, "--concurrency", "0,2"])
    assert "--concurrency" in capsys.readouterr().err
    assert cli_main(["bench", "realtime", "--base-url", srv.url, "--audio", str(tmp_path / "none.wav")]) == 2
