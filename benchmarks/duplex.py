"""Full duplex at real time: how many sessions a server holds at real time, and their frame latency, for omnistage
and for the authors' ``moshi.server`` (0.2.13) side by side, on the same Moshi folder and the same machine.

Both servers speak ``/api/chat`` (the authors' protocol: Ogg/Opus pages, one per 80 ms frame), so one client
drives both. For each session count N, N clients connect at once and each sends a microphone's worth of audio:
one page every 80 ms (paced by the clock, as a sound card is) for ``--seconds``. A frame's latency is the time
from sending the input frame that completes it to receiving its audio page (output frame j is stepped on input
frame j + 1: the first input frame only fills the delay pattern). A session is held at real time when its p99
frame latency stays within ``--late-ms`` (two frame periods by default) and every frame came back. Per server
and N: sessions served (``moshi.server`` holds one conversation at a time: the others wait for its handshake),
refused (omnistage's admission answers 429 once a step would outgrow the frame budget), held at real time, and
frame latency p50 / p99 over all served sessions. The two servers take turns at each N, the order alternating.

    python benchmarks/duplex.py [--model MOSHI_DIR] [--sessions 1,2,4,8] [--seconds 10] [--device cpu]
    python benchmarks/duplex.py --smoke   # 1 and 2 sessions for 3 s: checks that the script runs, records nothing

Without ``--model`` it serves the tiny Moshi the tests use (random weights, real architecture). ``moshi.server``
runs in the reference venv (``scripts/reference/moshi/setup.sh``; ``--ref-python``) through
``scripts/reference/moshi/serve_reference.py``. Sampling is both servers' default (the authors' ``LMGen`` values).
Results: ``benchmarks/results/duplex.{json,md}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx
import numpy as np
import sphn
import websockets

from omnistage.testing.server import ServeProcess, free_port

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
TINY = REPO / "tests" / "models" / "moshi" / "tiny"
RATE, FRAME, PERIOD_S = 24000, 1920, 0.08
DRAIN_S = 30.0  # after its last page, how long a session waits for the frames still owed
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def microphone(seconds: float, seed: int) -> list[bytes]:
    """``seconds`` of a talker-like signal (drifting tones under noise) as one Ogg/Opus page per frame."""
    rng = np.random.default_rng(seed)
    frames = max(3, round(seconds / PERIOD_S))
    t = np.arange(frames * FRAME) / RATE
    pcm = sum(rng.uniform(0.05, 0.2) * np.sin(2 * np.pi * rng.uniform(100, 900) * t) for _ in range(3))
    pcm = (pcm + 0.05 * rng.standard_normal(t.shape)).astype(np.float32)
    writer = sphn.OpusStreamWriter(RATE)
    return [writer.append_pcm(pcm[at : at + FRAME]) for at in range(0, len(pcm), FRAME)]


async def session(url: str, pages: list[bytes], wait_s: float) -> dict:
    """One conversation at real time; its outcome and its frames' latencies (s)."""
    try:
        ws = await websockets.connect(url + "/api/chat", max_size=None)
    except websockets.InvalidStatus as e:
        return {"outcome": f"refused {e.response.status_code}", "latency": []}
    async with ws:
        try:
            if await asyncio.wait_for(ws.recv(), wait_s) != b"\x00":
                return {"outcome": "no handshake", "latency": []}
        except TimeoutError:
            return {"outcome": "waiting", "latency": []}  # moshi.server: another conversation holds the model
        sent: list[float] = []
        received: list[float] = []

        async def speak() -> None:
            start = time.monotonic()
            for k, page in enumerate(pages):
                await asyncio.sleep(max(0.0, start + k * PERIOD_S - time.monotonic()))
                await ws.send(b"\x01" + page)
                sent.append(time.monotonic())

        async def listen() -> None:
            while len(received) < len(pages) - 1:
                message = await ws.recv()
                if message[:1] == b"\x01":
                    received.append(time.monotonic())

        speaker = asyncio.create_task(speak())
        try:
            await asyncio.wait_for(listen(), len(pages) * PERIOD_S + DRAIN_S)
        except TimeoutError:
            pass
        await speaker
    latency = [received[j] - sent[j + 1] for j in range(len(received))]
    return {"outcome": "served", "latency": latency, "complete": len(received) == len(pages) - 1}


async def level(url: str, n: int, seconds: float, wait_s: float) -> list[dict]:
    return await asyncio.gather(*(session(url, microphone(seconds, seed), wait_s) for seed in range(n)))


def summarize(results: list[dict], late_s: float) -> dict:
    served = [r for r in results if r["outcome"] == "served"]
    latency = [x for r in served for x in r["latency"]]
    real_time = [r for r in served if r["complete"] and r["latency"] and np.quantile(r["latency"], 0.99) <= late_s]
    return {
        "sessions": len(results),
        "served": len(served),
        "refused": sum(r["outcome"].startswith("refused") for r in results),
        "waiting": sum(r["outcome"] == "waiting" for r in results),
        "real_time": len(real_time),
        "frames": len(latency),
        "p50_ms": 1000 * float(np.quantile(latency, 0.5)) if latency else None,
        "p99_ms": 1000 * float(np.quantile(latency, 0.99)) if latency else None,
        "frames_late": sum(x > late_s for x in latency),
    }


def display_path(path: Path) -> str:
    """A folder inside the repository by its path there (a result file names no one machine's checkout)."""
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def start_reference(python: str, folder: Path, device: str, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    script = REPO / "scripts" / "reference" / "moshi" / "serve_reference.py"
    proc = subprocess.Popen(
        [python, str(script), str(folder), str(port), device], stdout=log.open("w"), stderr=subprocess.STDOUT, env=ENV
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:  # it has no health route: any HTTP answer means it listens (it starts after its warm-up)
        if proc.poll() is not None:
            raise RuntimeError(f"moshi.server exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            httpx.get(url + "/", timeout=2)
            return proc, url
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moshi.server not up in time:\n{log.read_text()[-3000:]}") from None
            time.sleep(1)


def run(args: argparse.Namespace, work: Path) -> dict:
    omni = ServeProcess.launch([str(args.model)], work / "omnistage.log", env={"OMP_NUM_THREADS": "1"})
    try:
        ref, ref_url = start_reference(args.ref_python, args.model, args.device, work / "moshi_server.log")
    except BaseException:  # the reference did not start: omnistage's server must not outlive the run
        omni.stop()
        raise
    urls = {"omnistage": omni.url.replace("http", "ws", 1), "moshi.server": ref_url.replace("http", "ws", 1)}
    rows: list[dict] = []
    try:
        for i, n in enumerate(args.sessions):
            for side in list(urls)[:: 1 if i % 2 == 0 else -1]:
                results = asyncio.run(level(urls[side], n, args.seconds, args.wait_s))
                rows.append({"server": side, **summarize(results, args.late_ms / 1000)})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        omni.stop()
        ref.terminate()
        ref.wait(60)
    return {
        "model": display_path(args.model),
        "device": args.device,
        "seconds": args.seconds,
        "late_ms": args.late_ms,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0]},
        "rows": rows,
    }


def markdown(result: dict) -> str:
    lines = [
        f"# Full duplex at real time: omnistage vs moshi.server ({result['device']})",
        "",
        f"Model `{result['model']}`; each session {result['seconds']} s of audio at real time; a session is held at "
        f"real time when every frame came back and its p99 frame latency is within {result['late_ms']:g} ms.",
        "",
        "| server | sessions | served | refused | waiting | real time | p50 ms | p99 ms | frames late |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        p50, p99 = (f"{r[k]:.1f}" if r[k] is not None else "-" for k in ("p50_ms", "p99_ms"))
        lines.append(
            f"| {r['server']} | {r['sessions']} | {r['served']} | {r['refused']} | {r['waiting']} | "
            f"{r['real_time']} | {p50} | {p99} | {r['frames_late']} |"
        )
    best = {
        side: max((r["real_time"] for r in result["rows"] if r["server"] == side), default=0)
        for side in ("omnistage", "moshi.server")
    }
    lines += [
        "",
        f"Most sessions held at real time: omnistage {best['omnistage']}, moshi.server {best['moshi.server']}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=TINY)
    parser.add_argument("--sessions", default="1,2,4,8")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--late-ms", type=float, default=2 * PERIOD_S * 1000)
    # moshi.server answers one conversation at a time: a client whose handshake has not come within this is counted
    # as waiting (it is not held at all), not as a session that started late
    parser.add_argument("--wait-s", type=float, default=2.0, help="how long a client waits for the handshake")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--ref-python", default="/work/ref-venvs/moshi/bin/python")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.sessions, args.seconds = "1,2", 3.0
    args.sessions = [int(n) for n in args.sessions.split(",")]
    with tempfile.TemporaryDirectory(prefix="duplex-bench-") as tmp:
        result = run(args, Path(tmp))
    table = markdown(result)
    print(table)
    if not args.smoke:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "duplex.json").write_text(json.dumps(result, indent=1) + "\n")
        (RESULTS / "duplex.md").write_text(table)


if __name__ == "__main__":
    main()
