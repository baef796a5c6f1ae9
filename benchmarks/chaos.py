"""Chaos under load: real `omnistage serve` processes on the tiny fixtures (loopback only), a mixed client load
on all of them at once, and `kill -9` of each engine kind in turn, several rounds; then the invariants.

Servers (phase 1, side by side):

- ``image``: prompt_expand — a vLLM LLM stage (its engine-core process) in front of SD3 diffusion in two ``mp``
  replicas. Load: images through both stages, streamed chats (``modalities: ["text"]``), chats the client
  drops after two events, bad requests. Killed: the vLLM engine core, a diffusion child.
- ``tts``: codec_tts — a vLLM speech LM streaming codes to the codec decoder (generation stage, ``mp``).
  Load: SSE-streamed speech, raw PCM streams, whole speech, dropped streams, bad requests. Killed: the
  generation child.
- ``csm``: Sesame CSM — the AR step engine (``mp``) streaming Mimi frames to the codec. Load as ``tts``.
  Killed: the AR step engine's process.
- ``video``: Wan — video jobs (POST, poll, content) on a diffusion stage in ``mp``. Killed: the diffusion child.

Phase 2, alone (it starts its own local Ray cluster, and `ray stop` ends every Ray process on the machine, so
it does not share the machine with the suite's Ray tests, nor with phase 1's load): ``ray`` — SD3 with its
stage in a Ray actor (``--distributed-executor-backend ray``). Killed: the actor.

Checked and reported: every request ends within ``DEADLINE_S``; valid ones end 200 or 503 ``stage_unavailable``
with ``Retry-After`` (streams: an SSE error event; raw streams: complete or visibly broken off), bad ones their
4xx, never 500 or a hang; ``/health`` is 200 again within ``RECOVERY_BOUND_S`` after each kill, with a new
process of that kind; seeded requests give the same bytes after the chaos as before; after SIGTERM no process
of any server's tree (nor a Ray actor) is left. Results: ``benchmarks/results/chaos.{json,md}``.

    python benchmarks/chaos.py [--rounds 3] [--ray-rounds 3] [--no-ray]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import httpx  # noqa: E402

from omnistage.testing import chaos as ch  # noqa: E402
from omnistage.testing.server import ServeProcess, free_port  # noqa: E402

RESULTS = Path(__file__).parent / "results"
MP = {"process": "mp"}


@dataclass
class Spec:
    """One server: how it is started, what it is sent, what is killed in it, what must not change."""

    name: str
    args: Callable[[Path], list[str]]  # from the folder of tiny fixtures
    calls: Callable[[str], list[tuple[str, Callable]]]  # from the server's URL (some measure a probe first)
    targets: list[tuple[str, Callable]]  # (engine kind, process finder)
    probes: dict[str, Callable[[httpx.Client], bytes]]
    threads: int = 2
    env: dict[str, str] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------ image + chat

IMAGE = {"prompt": "a red cat", "size": "32x32", "num_inference_steps": 3, "max_tokens": 12, "ignore_eos": True}
CHAT = {"messages": [{"role": "user", "content": "a lighthouse at dusk"}], "modalities": ["text"],
        "max_tokens": 24, "ignore_eos": True}
BAD_IMAGE = [
    ("/v1/images/generations", {"json": {"prompt": "x", "size": "8192x8192"}}, 400),
    ("/v1/images/generations", {"json": {"prompt": "x", "num_inference_steps": 500}}, 400),
    ("/v1/images/generations", {"content": b"{not json", "headers": {"content-type": "application/json"}}, 400),
    ("/v1/images/edits", {"json": {"prompt": "x", "image_url": "file:///etc/passwd"}}, 400),
    ("/v1/chat/completions", {"json": {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}}, 400),
    ("/v1/chat/completions", {"json": {"messages": [{"role": "user", "content": "x"}], "model": "gpt-4"}}, 404),
]


def image_probe(body: dict[str, Any]) -> Callable[[httpx.Client], bytes]:
    def probe(c: httpx.Client) -> bytes:
        r = c.post("/v1/images/generations", json={**body, "seed": 7})
        assert r.status_code == 200, r.text
        return base64.b64decode(r.json()["data"][0]["b64_json"])
    return probe


def chat_probe(c: httpx.Client) -> bytes:
    r = c.post("/v1/chat/completions", json={**CHAT, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"].encode()


def expander_folder(fx: Path) -> Path:
    folder = fx.parent / f"{fx.name}-expander"
    if not folder.exists():
        folder.mkdir()
        (folder / "llm").symlink_to(fx / "chat")
        (folder / "image").symlink_to(fx / "sd3")
        (folder / "omnistage.json").write_text(json.dumps({"pipeline": "prompt_expand"}))
    return folder


IMAGE_SERVER = Spec(
    "image", lambda fx: [str(expander_folder(fx)), "--enforce-eager", "--served-model-name", "image",
                         "--stage-overrides", json.dumps({"0": {"max_model_len": 512},
                                                          "1": {**MP, "num_replicas": 2}})],
    lambda url: [("image", ch.post_json("/v1/images/generations", IMAGE, ch.b64_images)),
                 ("chat_stream", ch.chat_stream(CHAT)),
                 ("chat_abandoned", ch.abandon("/v1/chat/completions", {**CHAT, "max_tokens": 400})),
                 ("bad", ch.bad(BAD_IMAGE)),
                 ("image", ch.post_json("/v1/images/generations", IMAGE, ch.b64_images)),
                 ("chat_stream", ch.chat_stream(CHAT))],
    [("vllm_engine_core", ch.engine_cores), ("diffusion_child", ch.stage_children)],
    {"image_seed7": image_probe(IMAGE), "chat_greedy": chat_probe}, threads=3)


# ------------------------------------------------------------------------------------------ speech


def speech_spec(name: str, fixture: str, overrides: dict, body: dict, kind: str, bad_cases: list) -> Spec:
    def probe(c: httpx.Client) -> bytes:
        r = c.post("/v1/audio/speech", json=body)
        assert r.status_code == 200, r.text
        return r.content

    def calls(url: str) -> list[tuple[str, Callable]]:
        with httpx.Client(base_url=url, timeout=120) as c:
            whole = len(probe(c))
        return [("speech_sse", ch.speech_sse(body)), ("speech_raw_stream", ch.speech_raw(body, whole)),
                ("speech_whole", ch.post_json("/v1/audio/speech", body, lambda r: len(r.content) == whole, seed=False)),
                ("speech_abandoned", ch.abandon("/v1/audio/speech", {**body, "stream_format": "sse"})),
                ("bad", ch.bad(bad_cases))]

    return Spec(name, lambda fx: [str(fx / fixture), "--served-model-name", name,
                                  "--stage-overrides", json.dumps(overrides)],
                calls, [(kind, ch.stage_children)], {f"{name}_greedy": probe})


TTS_BODY = {"input": "good morning to you", "voice": "alto", "response_format": "pcm", "temperature": 0,
            "max_tokens": 40}
CSM_BODY = {"input": "hello there friend", "response_format": "pcm", "temperature": 0, "max_tokens": 24}
TTS_SERVER = speech_spec("tts", "codec_tts", {"0": {"max_model_len": 512, "dtype": "float32"}, "1": MP},
                         TTS_BODY, "generation_child",
                         [("/v1/audio/speech", {"json": {"input": "hi", "voice": "tenor"}}, 400),
                          ("/v1/audio/speech", {"json": {"input": "   "}}, 400),
                          ("/v1/audio/speech", {"json": {"input": "hi", "speed": 1.5}}, 400),
                          ("/v1/images/generations", {"json": {"prompt": "x"}}, 400)])
CSM_SERVER = speech_spec("csm", "csm", {"0": MP}, CSM_BODY, "ar_step_process",
                         [("/v1/audio/speech", {"json": {"input": "hi", "voice": "7"}}, 400),
                          ("/v1/audio/speech", {"json": {"input": "hi", "max_tokens": -1}}, 400),
                          ("/v1/audio/speech", {"json": {"input": ""}}, 400)])


# ------------------------------------------------------------------------------------------ video + ray

VIDEO = {"prompt": "a cat", "size": "32x32", "num_frames": 5, "num_inference_steps": 3}


def video_probe(c: httpx.Client) -> bytes:
    job = c.post("/v1/videos", json={**VIDEO, "seed": 3}).json()
    deadline = time.monotonic() + ch.DEADLINE_S
    while (job := c.get(f"/v1/videos/{job['id']}").json())["status"] in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert job["status"] == "completed", job
    return c.get(f"/v1/videos/{job['id']}/content").content


VIDEO_SERVER = Spec(
    "video", lambda fx: [str(fx / "wan"), "--served-model-name", "video", "--stage-overrides", json.dumps({"0": MP})],
    lambda url: [("video_job", ch.video_job(VIDEO)),
                 ("bad", ch.bad([("/v1/videos", {"json": {"prompt": "x", "num_inference_steps": 500}}, 400),
                                 ("/v1/videos", {"json": {"prompt": "x", "num_frames": 100000}}, 400),
                                 ("/v1/videos/video_nope/content", {"method": "GET"}, 404)]))],
    [("diffusion_child", ch.stage_children)], {"video_seed3": video_probe})

SD3_IMAGE = {"prompt": "a red cat", "size": "32x32", "num_inference_steps": 4}
RAY_SERVER = Spec(
    # the stage says process: ray itself: sd3's deploy.yaml says `process: inline`, which wins over
    # --distributed-executor-backend ray (the flag only reaches stages that name no process)
    "ray", lambda fx: [str(fx / "sd3"), "--served-model-name", "ray", "--distributed-executor-backend", "ray",
                       "--stage-overrides", json.dumps({"0": {"process": "ray"}})],
    lambda url: [("image", ch.post_json("/v1/images/generations", SD3_IMAGE, ch.b64_images)),
                 ("bad", ch.bad(BAD_IMAGE[:3]))],
    [("ray_actor", ch.ray_stage_actors)], {"ray_image_seed7": image_probe(SD3_IMAGE)})


# ------------------------------------------------------------------------------------------ running


@dataclass
class Running:
    spec: Spec
    server: ServeProcess
    load: ch.Load | None = None
    before: dict[str, bytes] = field(default_factory=dict)


def start(spec: Spec, fx: Path, work: Path) -> Running:
    t0 = time.monotonic()
    server = ServeProcess.launch(spec.args(fx), work / f"{spec.name}.log", ready_timeout=900)
    print(f"[{spec.name}] up in {time.monotonic() - t0:.0f} s: {server.url}", flush=True)
    return Running(spec, server)


def probes(r: Running) -> dict[str, bytes]:
    with httpx.Client(base_url=r.server.url, timeout=ch.DEADLINE_S) as c:
        return {name: fn(c) for name, fn in r.spec.probes.items()}


def phase(specs: list[Spec], fx: Path, work: Path, rounds: int) -> dict[str, Any]:
    """Start the servers, probe, load them all, kill each target in turn ``rounds`` times, stop the load,
    probe again, SIGTERM and look for what is left."""
    t0 = time.monotonic()
    with ThreadPoolExecutor(len(specs)) as pool:
        running = list(pool.map(lambda s: start(s, fx, work), specs))
    startup_s = time.monotonic() - t0
    kills: list[ch.Kill] = []
    left: dict[str, list[str]] = {}
    try:
        for r in running:
            r.before = probes(r)
        for r in running:
            r.load = ch.Load(r.spec.name, r.server.url, r.spec.calls(r.server.url), threads=r.spec.threads).start()
        time.sleep(5)  # the load runs before anything is killed
        for n in range(rounds):
            for r in running:
                for kind, find in r.spec.targets:
                    k = ch.kill_and_recover(r.spec.name, r.server.url, r.server.proc.pid, kind, find)
                    print(f"round {n + 1}: {k}", flush=True)
                    kills.append(k)
        time.sleep(5)  # and after the last recovery
    finally:
        for r in running:
            if r.load is not None:
                r.load.stop()
    outcomes = [o for r in running for o in r.load.outcomes]
    after, in_flight = {}, {}
    for r in running:
        ch.wait_healthy(r.server.url, ch.RECOVERY_BOUND_S)
        after.update({k: v == r.before[k] for k, v in probes(r).items()})
        in_flight[r.spec.name] = ch.health(r.server.url)[1].get("in_flight")
    for r in running:
        procs = ch.tree(r.server.proc.pid) + (ch.ray_stage_actors() if r.spec.name == "ray" else [])
        r.server.stop()
        left[r.spec.name] = ch.left_after(procs)
    return {"servers": [r.spec.name for r in running], "startup_s": round(startup_s, 1),
            "duration_s": round(time.monotonic() - t0, 1), "kills": [asdict(k) for k in kills],
            "equal_after": after, "in_flight_after_load": in_flight, "left_after_sigterm": left,
            **ch.summary(outcomes)}


def ray_phase(fx: Path, work: Path, rounds: int) -> dict[str, Any]:
    import filelock

    ray_bin = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    port = free_port()
    # the suite's Ray tests take the same lock: one local cluster on the machine at a time
    with filelock.FileLock(Path(tempfile.gettempdir()) / "omnistage-tests-ray-cluster.lock"):
        subprocess.run([ray_bin, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                        "--disable-usage-stats", f"--temp-dir={work / 'ray'}"], check=True, env=env,
                       capture_output=True)
        os.environ.update(RAY_ADDRESS=f"127.0.0.1:{port}", RAY_AUTH_MODE="disabled")
        try:
            return phase([RAY_SERVER], fx, work, rounds)
        finally:
            os.environ.pop("RAY_ADDRESS", None)
            subprocess.run([ray_bin, "stop", "--force"], env=env, capture_output=True)


def verdict(p: dict[str, Any]) -> list[str]:
    """What broke an invariant in one phase (empty: none)."""
    bad = [f"{len(p['violations'])} request(s) broke an invariant"] if p["violations"] else []
    bad += [f"kill {k['server']}/{k['kind']}: {k['error'] or 'not replaced'}" for k in p["kills"]
            if k["error"] or not k["replaced"]]
    bad += [f"{name} differs after the chaos" for name, same in p["equal_after"].items() if not same]
    bad += [f"{s}: {n} still in flight" for s, n in p["in_flight_after_load"].items() if n]
    bad += [f"{s}: left after SIGTERM: {procs}" for s, procs in p["left_after_sigterm"].items() if procs]
    return bad


def report(result: dict[str, Any]) -> str:
    lines = ["# Chaos under load", "",
             f"`python benchmarks/chaos.py --rounds {result['rounds']} --ray-rounds {result['ray_rounds']}` on "
             f"{result['machine']}; the machine was shared with other work (load average at the start "
             f"{result['load_avg']}), so latencies and recovery times are upper bounds of a quiet machine.",
             "", f"Bounds: every request's deadline {ch.DEADLINE_S:.0f} s; recovery (`/health` 200 again) within "
             f"{ch.RECOVERY_BOUND_S:.0f} s of a kill.", "",
             f"**Verdict: {'PASS' if not result['broken'] else 'FAIL'}**"]
    lines += [f"- {b}" for b in result["broken"]]
    for name, p in result["phases"].items():
        kinds: dict[str, list[float]] = {}
        for k in p["kills"]:
            kinds.setdefault(f"{k['server']} / {k['kind']}", []).append(k["recovery_s"])
        lines += ["", f"## Phase {name}: servers {', '.join(p['servers'])}", "",
                  f"- start-up {p['startup_s']} s, whole phase {p['duration_s']} s, {p['requests']} requests",
                  "", "| killed (kill -9) | kills | in flight at the kill | /health went 503 | replaced | "
                  "recovery s (each) | max |", "|---|---|---|---|---|---|---|"]
        for kind, recs in kinds.items():
            ks = [k for k in p["kills"] if f"{k['server']} / {k['kind']}" == kind]
            lines.append(f"| {kind} | {len(ks)} | {', '.join(str(k['in_flight']) for k in ks)} | "
                         f"{sum(k['saw_unhealthy'] for k in ks)}/{len(ks)} | {sum(k['replaced'] for k in ks)}/{len(ks)} "
                         f"| {', '.join(f'{s:.1f}' for s in recs)} | {max(recs):.1f} |")
        lines += ["", "| server call outcome | requests |", "|---|---|"]
        lines += [f"| {k} | {n} |" for k, n in p["by_outcome"].items()]
        lines += ["", "| server call | max latency s |", "|---|---|"]
        lines += [f"| {k} | {v:.2f} |" for k, v in p["max_latency_s"].items()]
        lines += ["", "| seeded request | same bytes after the chaos |", "|---|---|"]
        lines += [f"| {k} | {'yes' if v else '**no**'} |" for k, v in p["equal_after"].items()]
        lines += ["", "| server | processes left 15 s after SIGTERM |", "|---|---|"]
        lines += [f"| {k} | {len(v)} {v if v else ''} |" for k, v in p["left_after_sigterm"].items()]
        if p["violations"]:
            lines += ["", "Violations (first 20):", ""]
            lines += [f"- {v['server']} {v['call']} at {v['t_s']} s: {v['result']}" for v in p["violations"][:20]]
    lines += ["", "Outcomes: `ok` 200 and complete; `unavailable` 503 `stage_unavailable` + `Retry-After` (a video "
              "job: failed `stage_unavailable`); `error_event` a 200 stream that ended with one `stage_unavailable` "
              "SSE error event; `broken_off` a raw PCM stream whose connection was cut before the end (the client "
              "sees an incomplete body); `abandoned` the client left after two events; `rejected` a bad request "
              "got its 4xx."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="kills of each engine kind in phase 1")
    ap.add_argument("--ray-rounds", type=int, default=3)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--servers", default="image,tts,csm,video", help="phase 1's servers, or none")
    ap.add_argument("--out", default="chaos")
    ap.add_argument("--fixtures", help="a folder of already built tiny fixtures (chat, sd3, codec_tts, csm, wan)")
    args = ap.parse_args()
    from omnistage.testing.tiny import build

    specs = {s.name: s for s in (IMAGE_SERVER, TTS_SERVER, CSM_SERVER, VIDEO_SERVER)}
    result: dict[str, Any] = {"rounds": args.rounds, "ray_rounds": 0 if args.no_ray else args.ray_rounds,
                              "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}, CPU only",
                              "load_avg": [round(x, 2) for x in os.getloadavg()], "phases": {}}
    with tempfile.TemporaryDirectory(prefix="omnistage-chaos-") as tmp:
        work = Path(tmp)
        fx = Path(args.fixtures) if args.fixtures else work / "fixtures"
        for name in () if args.fixtures else ("chat", "sd3", "codec_tts", "csm", "wan"):
            build(name, fx / name)
        os.environ["OMNISTAGE_SERVER_STORAGE__PATH"] = str(work / "storage")
        try:
            if args.servers != "none":
                result["phases"]["1"] = phase([specs[n] for n in args.servers.split(",")], fx, work, args.rounds)
            if not args.no_ray:
                result["phases"]["2 (Ray, alone)"] = ray_phase(fx, work, args.ray_rounds)
        finally:
            for log in work.glob("*.log"):  # the servers' side, kept for a failed run
                shutil.copy(log, Path(tempfile.gettempdir()) / f"omnistage-chaos-{log.name}")
    result["broken"] = [b for p in result["phases"].values() for b in verdict(p)]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(result, indent=1))
    text = report(result)
    (RESULTS / f"{args.out}.md").write_text(text)
    print(text)
    return 0 if not result["broken"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
