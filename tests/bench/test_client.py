"""The bench client against a real local HTTP server speaking the HTTP API's shapes (docs/server.md).

The server here is the counterpart, not the thing under test: it replies with
fixed, known streams so the client's parsing, timing bookkeeping, concurrency
cap, JSON/PNG/save-dir outputs can be checked exactly.
"""

import asyncio
import base64
import io
import json

import numpy as np
import pytest
import soundfile as sf
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from PIL import Image

from omnistage.cli.main import main as cli_main
from omnistage.testing.server import free_port, serve_app


def png_b64(w, h):
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (10, 200, 30)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def make_app(state):
    app = FastAPI()
    state.update(inflight=0, max_inflight=0, bodies=[], jobs={})

    async def busy(seconds):
        state["inflight"] += 1
        state["max_inflight"] = max(state["max_inflight"], state["inflight"])
        try:
            await asyncio.sleep(seconds)
        finally:
            state["inflight"] -= 1

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "tiny-model", "object": "model"}]}

    @app.post("/v1/images/generations")
    async def images(request: Request):
        body = await request.json()
        state["bodies"].append(body)
        if body["prompt"] == "FAIL":
            return JSONResponse(
                {"error": {"message": "bad prompt", "type": "invalid_request_error", "param": "prompt", "code": 400}},
                status_code=400,
            )
        await busy(0.05)
        w, h = map(int, body.get("size", "16x16").split("x"))
        out = {"created": 0, "data": [{"b64_json": png_b64(w, h)}]}
        if body.get("return_stage_metrics"):
            out["stage_metrics"] = [{"stage_id": 0, "queue_time_s": 0.01, "run_time_s": 0.04, "peak_memory_mb": 123.0}]
        return out

    @app.post("/v1/images/edits")
    async def edits(request: Request):
        form = await request.form()
        image = await form["image"].read()
        state["bodies"].append(
            {
                "prompt": form["prompt"],
                "image_size": Image.open(io.BytesIO(image)).size,
                "num_inference_steps": form.get("num_inference_steps"),
            }
        )
        return {"created": 0, "data": [{"b64_json": png_b64(8, 8)}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        state["bodies"].append(body)

        async def stream():
            def sse(delta, usage):
                c = {
                    "object": "chat.completion.chunk",
                    "modality": "text",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
                }
                if usage is not None:
                    c["usage"] = {"prompt_tokens": 4, "completion_tokens": usage, "total_tokens": 4 + usage}
                return f"data: {json.dumps(c)}\n\n"

            yield sse({"role": "assistant", "content": ""}, 0)
            await asyncio.sleep(0.02)
            yield sse({"content": "A"}, 1)
            await asyncio.sleep(0.02)
            yield sse({"content": "BCD"}, 4)
            yield "data: " + json.dumps({"choices": [], "usage": {"completion_tokens": 4}}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    @app.post("/v1/videos/sync")
    async def video_sync(request: Request):
        return Response(b"\x00\x00\x00\x18ftypmp42fake", media_type="video/mp4")

    @app.post("/v1/videos")
    async def video_job(request: Request):
        job_id = f"video-{len(state['jobs'])}"
        state["jobs"][job_id] = 0
        return {"id": job_id, "object": "video", "status": "queued"}

    @app.get("/v1/videos/{job_id}")
    async def video_status(job_id: str):
        state["jobs"][job_id] += 1  # completes on the second poll
        status = "completed" if state["jobs"][job_id] >= 2 else "in_progress"
        return {"id": job_id, "status": status, "progress": 100 if status == "completed" else 50}

    @app.get("/v1/videos/{job_id}/content")
    async def video_content(job_id: str):
        return Response(b"mp4-" + job_id.encode(), media_type="video/mp4")

    @app.post("/v1/audio/speech")
    async def speech(request: Request):
        body = await request.json()
        state["bodies"].append(body)
        buf = io.BytesIO()
        sf.write(buf, np.zeros(12000, dtype=np.float32), 24000, format="WAV")  # 0.5 s
        return Response(buf.getvalue(), media_type="audio/wav")

    return app


@pytest.fixture(scope="module")
def server():
    state = {}
    with serve_app(make_app(state)) as srv:
        yield srv.url, state


def bench(url, tmp_path, *args):
    out = tmp_path / "result.json"
    rc = cli_main(["bench", "serve", "--base-url", url, "--output-file", str(out), "--disable-tqdm", *args])
    return rc, json.loads(out.read_text())


def test_t2i_concurrency_cap_outputs_and_metrics(server, tmp_path):
    url, state = server
    state["bodies"].clear()
    rc, doc = bench(
        url,
        tmp_path,
        "--task",
        "t2i",
        "--num-prompts",
        "6",
        "--max-concurrency",
        "2",
        "--width",
        "24",
        "--height",
        "16",
        "--num-inference-steps",
        "5",
        "--warmup-requests",
        "1",
        "--return-stage-metrics",
        "--save-dir",
        str(tmp_path / "imgs"),
    )
    assert rc == 0
    m = doc["metrics"]
    assert m["completed_requests"] == 6 and m["failed_requests"] == 0
    assert 0 < state["max_inflight"] <= 2
    # warm-up used 2 steps; the calibration request and the load used 5
    assert [b["num_inference_steps"] for b in state["bodies"]] == [2] + [5] * 7
    assert state["bodies"][1]["model"] == "tiny-model" and state["bodies"][1]["size"] == "24x16"
    assert m["peak_memory_mb_max"] == 123.0
    assert m["stage_durations_mean"]["0"] == pytest.approx(0.05)
    assert doc["slo_reference_latency"] > 0 and m["slo_s"] == pytest.approx(3.0 * doc["slo_reference_latency"])
    # the share of the 6 requests that finished within the SLO, from the per-request latencies it reports
    assert m["slo_attainment_rate"] == sum(r["success"] and r["latency"] <= m["slo_s"] for r in doc["requests"]) / 6
    assert m["throughput_qps"] == pytest.approx(6 / m["duration"])
    saved = sorted((tmp_path / "imgs").iterdir())
    assert len(saved) == 6 and Image.open(saved[0]).size == (24, 16)
    assert (tmp_path / "result.png").stat().st_size > 0


def test_failed_requests_are_counted_not_raised(server, tmp_path):
    url, _ = server
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "ok"}\n{"prompt": "FAIL"}\n')
    rc, doc = bench(
        url,
        tmp_path,
        "--task",
        "t2i",
        "--dataset",
        "custom",
        "--dataset-path",
        str(data),
        "--num-prompts",
        "2",
        "--warmup-requests",
        "0",
        "--slo",
        "10",
    )
    assert rc == 0
    assert doc["metrics"]["completed_requests"] == 1 and doc["metrics"]["failed_requests"] == 1
    failed = [r for r in doc["requests"] if not r["success"]]
    assert failed[0]["error"] == "HTTP 400: bad prompt"
    assert doc["metrics"]["slo_attainment_rate"] == pytest.approx(0.5)


def test_chat_stream_token_accounting(server, tmp_path):
    url, state = server
    state["bodies"].clear()
    rc, doc = bench(
        url,
        tmp_path,
        "--task",
        "chat",
        "--num-prompts",
        "3",
        "--output-len",
        "4",
        "--warmup-requests",
        "0",
        "--slo-scale",
        "0",
        "--request-rate",
        "50",
    )
    assert rc == 0
    body = state["bodies"][0]
    assert body["stream"] is True and body["stream_options"]["continuous_usage_stats"] is True
    assert body["max_tokens"] == 4 and body["ignore_eos"] is True
    for r in doc["requests"]:
        assert r["output_tokens"] == 4
        assert len(r["itl"]) == 3
        assert r["e2e_text"] - r["ttft"] == pytest.approx(sum(r["itl"]))
        assert r["tpot"] == pytest.approx(sum(r["itl"]) / 3)
    m = doc["metrics"]
    assert m["total_output_tokens"] == 12 and m["requests_without_token_count"] == 0
    assert m["slo_attainment_rate"] is None
    assert m["ttft_mean_ms"] > 0 and m["itl_p99_ms"] > 0


def test_omni_chat_with_audio_in_sends_an_input_audio_part(server, tmp_path):
    url, state = server
    state["bodies"].clear()
    rc, _ = bench(
        url,
        tmp_path,
        "--task",
        "omni",
        "--num-prompts",
        "2",
        "--chat-audio",
        "0.25",
        "--warmup-requests",
        "0",
        "--slo-scale",
        "0",
    )
    assert rc == 0 and len(state["bodies"]) == 2
    body = state["bodies"][0]
    assert body["modalities"] == ["text", "audio"]
    audio, text = body["messages"][0]["content"]
    assert audio["type"] == "input_audio" and audio["input_audio"]["format"] == "wav"
    samples, rate = sf.read(io.BytesIO(base64.b64decode(audio["input_audio"]["data"])))
    assert rate == 16000 and samples.shape == (4000,)
    assert text["type"] == "text" and text["text"]


def test_i2i_multipart(server, tmp_path):
    url, state = server
    state["bodies"].clear()
    rc, doc = bench(
        url,
        tmp_path,
        "--task",
        "i2i",
        "--num-prompts",
        "2",
        "--width",
        "20",
        "--height",
        "12",
        "--num-inference-steps",
        "3",
        "--warmup-requests",
        "0",
        "--slo-scale",
        "0",
    )
    assert rc == 0 and doc["metrics"]["completed_requests"] == 2
    assert state["bodies"][0]["image_size"] == (20, 12) and state["bodies"][0]["num_inference_steps"] == "3"


@pytest.mark.parametrize("endpoint", ["/v1/videos/sync", "/v1/videos"])
def test_video_sync_and_job(server, tmp_path, endpoint):
    url, _ = server
    rc, doc = bench(
        url,
        tmp_path,
        "--task",
        "t2v",
        "--endpoint",
        endpoint,
        "--num-prompts",
        "2",
        "--num-frames",
        "5",
        "--warmup-requests",
        "0",
        "--slo-scale",
        "0",
        "--save-dir",
        str(tmp_path / "vids"),
    )
    assert rc == 0 and doc["metrics"]["completed_requests"] == 2
    files = sorted((tmp_path / "vids").iterdir())
    assert len(files) == 2 and files[0].suffix == ".mp4" and files[0].stat().st_size > 0


def test_tts_audio_metrics(server, tmp_path):
    url, state = server
    rc, doc = bench(
        url,
        tmp_path,
        "--task",
        "tts",
        "--num-prompts",
        "2",
        "--voice",
        "alice",
        "--warmup-requests",
        "0",
        "--slo-scale",
        "0",
    )
    assert rc == 0
    r = doc["requests"][0]
    assert r["audio_duration"] == pytest.approx(0.5)
    assert doc["metrics"]["audio_rtf_mean"] == pytest.approx(np.mean([x["latency"] / 0.5 for x in doc["requests"]]))
    assert state["bodies"][-1]["voice"] == "alice"


def test_unreachable_server_fails_cleanly(tmp_path):
    rc, doc = bench(
        f"http://127.0.0.1:{free_port()}",
        tmp_path,
        "--task",
        "t2i",
        "--num-prompts",
        "2",
        "--warmup-requests",
        "0",
        "--slo-scale",
        "0",
    )
    assert rc == 1
    assert doc["metrics"]["failed_requests"] == 2
