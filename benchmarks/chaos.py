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
- ``whisper``: tiny Whisper on vLLM — transcriptions of an uploaded WAV, whole and SSE-streamed, plus bad
  uploads. Killed: the vLLM engine core.
- ``realtime``: tiny Qwen3-Omni answering /v1/realtime sessions (``chaos_realtime.py``). Killed: the thinker's vLLM
  engine core, the talker's AR step engine process.

Phase 2, alone (it starts its own local Ray cluster, and `ray stop` ends every Ray process on the machine, so
it does not share the machine with the suite's Ray tests, nor with phase 1's load): ``ray`` — SD3 with its
stage in a Ray actor (``--distributed-executor-backend ray``), sent images of many steps so that kills land
mid-request. Killed: the actor.

Checked and reported: every request ends within ``DEADLINE_S``; valid ones end 200 or 503 ``stage_unavailable``
with ``Retry-After`` (streams: an SSE error event; raw streams: complete or visibly broken off), bad ones their
4xx, never 500 or a hang; ``/health`` is 200 again within ``RECOVERY_BOUND_S`` after each kill, with a new
process of that kind; seeded requests give the same bytes after the chaos as before; after SIGTERM no process
of any server's tree (nor a Ray actor) is left; and how the requests running at each kill ended. Results:
``benchmarks/results/chaos.{json,md}``; ``--update`` folds a partial run (``--servers whisper --no-ray``,
``--servers none``, ``--servers realtime``) into the recorded one, each phase keeping the run it came from.

    python benchmarks/chaos.py [--rounds 3] [--ray-rounds 3] [--no-ray] [--servers a,b|none] [--update]
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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import httpx  # noqa: E402

from omnistage.bench.datasets import random_audio, wav_bytes  # noqa: E402
from omnistage.testing import chaos as ch  # noqa: E402
from omnistage.testing import processes as pr  # noqa: E402
from omnistage.testing.server import ServeProcess, free_port  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from chaos_realtime import SPEC as REALTIME_SPEC  # noqa: E402
from chaos_report import merge, report, verdict  # noqa: E402

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
CHAT = {
    "messages": [{"role": "user", "content": "a lighthouse at dusk"}],
    "modalities": ["text"],
    "max_tokens": 24,
    "ignore_eos": True,
}
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
    "image",
    lambda fx: [
        str(expander_folder(fx)),
        "--enforce-eager",
        "--served-model-name",
        "image",
        "--stage-overrides",
        json.dumps({"0": {"max_model_len": 512}, "1": {**MP, "num_replicas": 2}}),
    ],
    lambda url: [
        ("image", ch.post_json("/v1/images/generations", IMAGE, ch.b64_images)),
        ("chat_stream", ch.chat_stream(CHAT)),
        ("chat_abandoned", ch.abandon("/v1/chat/completions", {**CHAT, "max_tokens": 400})),
        ("bad", ch.bad(BAD_IMAGE)),
        ("image", ch.post_json("/v1/images/generations", IMAGE, ch.b64_images)),
        ("chat_stream", ch.chat_stream(CHAT)),
    ],
    [("vllm_engine_core", pr.engine_cores), ("diffusion_child", pr.stage_children)],
    {"image_seed7": image_probe(IMAGE), "chat_greedy": chat_probe},
    threads=3,
)


# ------------------------------------------------------------------------------------------ speech


def speech_spec(name: str, fixture: str, overrides: dict, body: dict, kind: str, bad_cases: list) -> Spec:
    def probe(c: httpx.Client) -> bytes:
        r = c.post("/v1/audio/speech", json=body)
        assert r.status_code == 200, r.text
        return r.content

    def calls(url: str) -> list[tuple[str, Callable]]:
        with httpx.Client(base_url=url, timeout=120) as c:
            whole = len(probe(c))
        return [
            ("speech_sse", ch.speech_sse(body)),
            ("speech_raw_stream", ch.speech_raw(body, whole)),
            ("speech_whole", ch.post_json("/v1/audio/speech", body, lambda r: len(r.content) == whole, seed=False)),
            ("speech_abandoned", ch.abandon("/v1/audio/speech", {**body, "stream_format": "sse"})),
            ("bad", ch.bad(bad_cases)),
        ]

    return Spec(
        name,
        lambda fx: [str(fx / fixture), "--served-model-name", name, "--stage-overrides", json.dumps(overrides)],
        calls,
        [(kind, pr.stage_children)],
        {f"{name}_greedy": probe},
    )


TTS_BODY = {
    "input": "good morning to you",
    "voice": "alto",
    "response_format": "pcm",
    "temperature": 0,
    "max_tokens": 40,
}
CSM_BODY = {"input": "hello there friend", "response_format": "pcm", "temperature": 0, "max_tokens": 24}
TTS_SERVER = speech_spec(
    "tts",
    "codec_tts",
    {"0": {"max_model_len": 512, "dtype": "float32"}, "1": MP},
    TTS_BODY,
    "generation_child",
    [
        ("/v1/audio/speech", {"json": {"input": "hi", "voice": "tenor"}}, 400),
        ("/v1/audio/speech", {"json": {"input": "   "}}, 400),
        ("/v1/audio/speech", {"json": {"input": "hi", "speed": 1.5}}, 400),
        ("/v1/images/generations", {"json": {"prompt": "x"}}, 400),
    ],
)
CSM_SERVER = speech_spec(
    "csm",
    "csm",
    {"0": MP},
    CSM_BODY,
    "ar_step_process",
    [
        ("/v1/audio/speech", {"json": {"input": "hi", "voice": "7"}}, 400),
        ("/v1/audio/speech", {"json": {"input": "hi", "max_tokens": -1}}, 400),
        ("/v1/audio/speech", {"json": {"input": ""}}, 400),
    ],
)


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
    "video",
    lambda fx: [str(fx / "wan"), "--served-model-name", "video", "--stage-overrides", json.dumps({"0": MP})],
    lambda url: [
        ("video_job", ch.video_job(VIDEO)),
        (
            "bad",
            ch.bad(
                [
                    ("/v1/videos", {"json": {"prompt": "x", "num_inference_steps": 500}}, 400),
                    ("/v1/videos", {"json": {"prompt": "x", "num_frames": 100000}}, 400),
                    ("/v1/videos/video_nope/content", {"method": "GET"}, 404),
                ]
            ),
        ),
    ],
    [("diffusion_child", pr.stage_children)],
    {"video_seed3": video_probe},
)

# many steps: a request lasts long enough (about a second) that an actor kill lands while some are running
SD3_IMAGE = {"prompt": "a red cat", "size": "32x32", "num_inference_steps": 60}
RAY_SERVER = Spec(
    # the stage says process: ray itself: --distributed-executor-backend ray only reaches stages that name no
    # process, and a family's deploy.yaml may name one (sd3's said `process: inline` in the first run)
    "ray",
    lambda fx: [
        str(fx / "sd3"),
        "--served-model-name",
        "ray",
        "--distributed-executor-backend",
        "ray",
        "--stage-overrides",
        json.dumps({"0": {"process": "ray"}}),
    ],
    lambda url: [
        ("image", ch.post_json("/v1/images/generations", SD3_IMAGE, ch.b64_images)),
        ("bad", ch.bad(BAD_IMAGE[:3])),
    ],
    [("ray_actor", pr.ray_stage_actors)],
    {"ray_image_seed7": image_probe(SD3_IMAGE)},
)


# ------------------------------------------------------------------------------------------ transcriptions

WAV = wav_bytes(random_audio(3.0, 5))
# greedy and ignore_eos: every transcription is 64 decoder steps, long enough for a kill to land in some
TRANSCRIBE = {"model": "whisper", "language": "en", "temperature": "0", "max_tokens": "64", "ignore_eos": "true"}


def transcribe(stream: bool) -> Callable[[httpx.Client, int], str]:
    def call(c: httpx.Client, i: int) -> str:
        kw = {"files": {"file": ("clip.wav", WAV, "audio/wav")}, "data": {**TRANSCRIBE, "stream": str(stream).lower()}}
        if not stream:
            return ch.valid_json(
                c.post("/v1/audio/transcriptions", **kw), lambda r: isinstance(r.json().get("text"), str)
            )
        with c.stream("POST", "/v1/audio/transcriptions", **kw) as r:
            return ch.valid_stream(
                r, lambda ev: bool(ev) and isinstance(ev[-1], dict) and ev[-1].get("type") == "transcript.text.done"
            )

    return call


def transcript_probe(c: httpx.Client) -> bytes:
    r = c.post("/v1/audio/transcriptions", files={"file": ("clip.wav", WAV, "audio/wav")}, data=TRANSCRIBE)
    assert r.status_code == 200, r.text
    return r.json()["text"].encode()


def upload(data: dict[str, str], file: tuple[str, bytes, str] = ("clip.wav", WAV, "audio/wav")) -> dict[str, Any]:
    return {"files": {"file": file}, "data": {"model": "whisper", **data}}


WHISPER_SERVER = Spec(
    "whisper",
    lambda fx: [
        str(fx / "whisper"),
        "--enforce-eager",
        "--served-model-name",
        "whisper",
        "--stage-overrides",
        json.dumps({"0": {"max_model_len": 448, "dtype": "float32"}}),
    ],
    lambda url: [
        ("transcribe", transcribe(False)),
        ("transcribe_stream", transcribe(True)),
        (
            "bad",
            ch.bad(
                [
                    ("/v1/audio/transcriptions", upload({"language": "xx"}), 400),
                    ("/v1/audio/transcriptions", upload({"response_format": "mp3"}), 400),
                    ("/v1/audio/transcriptions", upload({}, ("clip.wav", b"RIFF....WAVEjunk", "audio/wav")), 400),
                    ("/v1/audio/transcriptions", {"data": {"model": "whisper"}}, 415),
                ]
            ),
        ),
    ],  # not multipart
    [("vllm_engine_core", pr.engine_cores)],
    {"whisper_greedy": transcript_probe},
)


SERVERS = {
    s.name: s for s in (IMAGE_SERVER, TTS_SERVER, CSM_SERVER, VIDEO_SERVER, WHISPER_SERVER, Spec(**REALTIME_SPEC))
}
# the tiny fixtures each server is started on
FIXTURES = {
    "image": ("chat", "sd3"),
    "tts": ("codec_tts",),
    "csm": ("csm",),
    "video": ("wan",),
    "whisper": ("whisper",),
    "realtime": ("qwen3_omni",),
    "ray": ("sd3",),
}


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
    loads = {r.spec.name: r.load for r in running}
    kill_rows = [
        {**asdict(k), "spanning": ch.spanning(loads[k.server].outcomes, loads[k.server].started_at, k)} for k in kills
    ]
    after, in_flight = {}, {}
    for r in running:
        ch.wait_healthy(r.server.url, ch.RECOVERY_BOUND_S)
        after.update({k: v == r.before[k] for k, v in probes(r).items()})
        in_flight[r.spec.name] = ch.health(r.server.url)[1].get("in_flight")
    unclean: dict[str, str] = {}
    for r in running:
        procs = pr.tree(r.server.proc.pid) + (pr.ray_stage_actors() if r.spec.name == "ray" else [])
        try:
            r.server.stop()
        except AssertionError as e:  # (no clean exit after SIGTERM: recorded as a break, the rest still counted)
            code = r.server.proc.returncode
            unclean[r.spec.name] = f"exit status {code}" + ("" if str(e) == str(code) else f": {e}")
        left[r.spec.name] = pr.left_after(procs)
    return {
        "servers": [r.spec.name for r in running],
        "startup_s": round(startup_s, 1),
        "duration_s": round(time.monotonic() - t0, 1),
        "kills": kill_rows,
        "equal_after": after,
        "in_flight_after_load": in_flight,
        "left_after_sigterm": left,
        "unclean_exit": unclean,
        **ch.summary(outcomes),
    }


def ray_phase(fx: Path, work: Path, rounds: int) -> dict[str, Any]:
    import filelock

    ray_bin = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    port = free_port()
    # the suite's Ray tests take the same lock: one local cluster on the machine at a time
    with filelock.FileLock(Path(tempfile.gettempdir()) / "omnistage-tests-ray-cluster.lock"):
        subprocess.run(
            [
                ray_bin,
                "start",
                "--head",
                f"--port={port}",
                "--num-cpus=2",
                "--include-dashboard=false",
                "--disable-usage-stats",
                f"--temp-dir={work / 'ray'}",
            ],
            check=True,
            env=env,
            capture_output=True,
        )
        os.environ.update(RAY_ADDRESS=f"127.0.0.1:{port}", RAY_AUTH_MODE="disabled")
        try:
            return phase([RAY_SERVER], fx, work, rounds)
        finally:
            os.environ.pop("RAY_ADDRESS", None)
            subprocess.run([ray_bin, "stop", "--force"], env=env, capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="kills of each engine kind in phase 1")
    ap.add_argument("--ray-rounds", type=int, default=3)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--servers", default=",".join(SERVERS), help="phase 1's servers, or none")
    ap.add_argument("--update", action="store_true", help="fold this run's phases into the recorded results")
    ap.add_argument("--out", default="chaos")
    ap.add_argument(
        "--fixtures",
        help="a folder of already built tiny fixtures ("
        + ", ".join(sorted({f for fs in FIXTURES.values() for f in fs}))
        + ")",
    )
    args = ap.parse_args()
    from omnistage.testing.tiny import build

    names = [] if args.servers == "none" else args.servers.split(",")
    run = {
        "command": " ".join(["python benchmarks/chaos.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }
    result: dict[str, Any] = {"machine": f"{os.cpu_count()} CPU cores, {platform.machine()}, CPU only", "phases": {}}
    with tempfile.TemporaryDirectory(prefix="omnistage-chaos-") as tmp:
        work = Path(tmp)
        fx = Path(args.fixtures) if args.fixtures else work / "fixtures"
        wanted = {f for n in names + ([] if args.no_ray else ["ray"]) for f in FIXTURES[n]}
        for name in () if args.fixtures else sorted(wanted):
            build(name, fx / name)
        os.environ["OMNISTAGE_SERVER_STORAGE__PATH"] = str(work / "storage")
        try:
            if names:  # the full set is phase 1; a partial one is named after its servers
                key = "1" if names == list(SERVERS) else f"1 ({','.join(names)})"
                result["phases"][key] = {
                    "run": {**run, "rounds": args.rounds},
                    **phase([SERVERS[n] for n in names], fx, work, args.rounds),
                }
            if not args.no_ray:
                result["phases"]["2 (Ray, alone)"] = {
                    "run": {**run, "rounds": args.ray_rounds},
                    **ray_phase(fx, work, args.ray_rounds),
                }
        finally:
            for log in work.glob("*.log"):  # the servers' side, kept for a failed run
                shutil.copy(log, Path(tempfile.gettempdir()) / f"omnistage-chaos-{log.name}")
    RESULTS.mkdir(exist_ok=True)
    recorded = RESULTS / f"{args.out}.json"
    if args.update and recorded.exists():
        result = merge(json.loads(recorded.read_text()), result)
    result["broken"] = [b for p in result["phases"].values() for b in verdict(p)]
    recorded.write_text(json.dumps(result, indent=1))
    text = report(result)
    (RESULTS / f"{args.out}.md").write_text(text)
    print(text)
    return 0 if not result["broken"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
