"""How long the things the tests check by order take: the numbers the tests do not assert.

- ``lane_hold``: after an urgent CPU call (stages/lane.py), how long until a plain call starts, against a plain call
  after a plain call (the lane's own overhead); the hold is meant to be ``URGENT_FOLLOW_UP_S``.
- ``saturated_503``: with ``--max-pending`` reached (requests held in the stage), how long a further request takes to
  be refused with 503, against ``GET /health`` on the same server (tests/server/test_backpressure.py checks that the
  refusal comes while the admitted requests still wait).
- ``hostile_upload``: how long a PNG declaring 60000x60000 pixels (as an edit's upload and as a chat part) and an
  MP4 declaring 10^9 frames take to be refused (tests/server/test_hostile_media.py checks that they never reach the
  engine), against a valid 64x64 PNG edit that runs the test pipeline's model.

Medians over ``--runs``, alternated so a busy machine hits both sides alike; the ratio is what to compare across
machines.

    python benchmarks/refusal_times.py [--runs 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))  # the test pipelines and hostile files live in tests/


def timed(call) -> float:
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def lane_hold(runs: int) -> dict:
    from omnistage.stages.lane import URGENT_FOLLOW_UP_S, run_on

    async def after(urgent: bool) -> float:
        await run_on("cpu", time.sleep, 0, urgent=urgent)
        t0 = time.perf_counter()
        await run_on("cpu", time.sleep, 0)
        return time.perf_counter() - t0

    async def main() -> tuple[list[float], list[float]]:
        held, plain = [], []
        for _ in range(runs):
            held.append(await after(True))
            plain.append(await after(False))
        return held, plain

    held, plain = asyncio.run(main())
    return {
        "urgent_follow_up_s": URGENT_FOLLOW_UP_S,
        "plain_after_urgent_ms": 1000 * statistics.median(held),
        "plain_after_plain_ms": 1000 * statistics.median(plain),
        "max_plain_after_urgent_ms": 1000 * max(held),
    }


def saturated_503(runs: int) -> dict:
    from omnistage import AsyncOmni
    from omnistage.testing.server import serve_engine
    from tests.server.pipelines import GATE, image_pipeline

    srv = serve_engine(AsyncOmni(pipeline=image_pipeline()), max_pending=2, retry_after_s=4)
    body = {"prompt": "x", "size": "16x16"}
    try:
        with ThreadPoolExecutor(2) as pool, httpx.Client(base_url=srv.url, timeout=120) as c:
            GATE.clear()
            held = [
                pool.submit(c.post, "/v1/images/generations", json={**body, "prompt": f"block: {i}"}) for i in (0, 1)
            ]
            while srv.state.admission.pending < 2:
                time.sleep(0.01)
            refused, health = [], []
            for _ in range(runs):
                refused.append(timed(lambda: c.post("/v1/images/generations", json=body)))
                health.append(timed(lambda: c.get("/health")))
            status = c.post("/v1/images/generations", json=body).status_code
            GATE.set()
            [f.result() for f in held]
    finally:
        srv.stop()
    return {
        "status": status,
        "refusal_ms": 1000 * statistics.median(refused),
        "health_ms": 1000 * statistics.median(health),
        "ratio": statistics.median(refused) / statistics.median(health),
    }


def hostile_upload(runs: int) -> dict:
    from omnistage import AsyncOmni
    from omnistage.testing.server import serve_engine
    from tests.server.pipelines import image_pipeline
    from tests.server.test_hostile_media import LIMITS, chat, chat_part, mp4_claiming_frames, png, png_bomb

    srv = serve_engine(AsyncOmni(pipeline=image_pipeline()), **LIMITS)  # it decodes chat media itself
    bomb, frames_bomb, picture = png_bomb(), mp4_claiming_frames(), png()
    cases = {
        "png_bomb_edit": lambda c: c.post(
            "/v1/images/edits",
            data={"prompt": "x", "size": "32x32"},
            files={"image": ("in.png", bomb, "image/png")},
        ),
        "png_bomb_chat": lambda c: chat(srv, chat_part("image_url", bomb, "image/png")),
        "mp4_1e9_frames_chat": lambda c: chat(srv, chat_part("video_url", frames_bomb, "video/mp4")),
    }

    def valid(c):
        return c.post(
            "/v1/images/edits", data={"prompt": "x", "size": "32x32"}, files={"image": ("in.png", picture, "image/png")}
        )

    out: dict = {}
    try:
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            base = []
            times: dict[str, list[float]] = {k: [] for k in cases}
            statuses: dict[str, int] = {}
            for _ in range(runs):
                base.append(timed(lambda: valid(c)))
                for name, case in cases.items():
                    times[name].append(timed(lambda: statuses.__setitem__(name, case(c).status_code)))
            out["valid_edit"] = {"status": valid(c).status_code, "ms": 1000 * statistics.median(base)}
            for name in cases:
                out[name] = {
                    "status": statuses[name],
                    "refusal_ms": 1000 * statistics.median(times[name]),
                    "max_ms": 1000 * max(times[name]),
                    "ratio_to_valid": statistics.median(times[name]) / statistics.median(base),
                }
    finally:
        srv.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    result = {
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch thread, CPU",
        "runs": args.runs,
        "lane_hold": lane_hold(args.runs * 10),
        "saturated_503": saturated_503(args.runs),
        "hostile_upload": hostile_upload(args.runs),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "refusal_times.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
