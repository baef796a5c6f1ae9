"""Chaos under load, for ``benchmarks/chaos.py`` and the short chaos test: client threads send a mix of
valid, bad and abandoned requests to real ``omnistage serve`` processes while engine processes are killed
(``kill -9``) one kind at a time; every answer is classified against the invariants the server promises.

- a valid request ends ``200`` (``ok``) or ``503 stage_unavailable`` with ``Retry-After`` (``unavailable``);
  a stream that had started ends with an SSE error event naming ``stage_unavailable`` (``error_event``);
  a video job ends ``completed`` or ``failed`` with ``stage_unavailable``;
- a bad request gets exactly the 4xx it must get, with an ``error`` body (``rejected``);
- an abandoned stream (the client leaves after two events) starts ``200`` or ``503``;
- nothing takes longer than the deadline. Anything else is a ``VIOLATION: ...`` outcome.

``kill_and_recover`` kills one process a finder (processes.py) names under load and times how long ``/health``
takes to be 200 again.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
import psutil

DEADLINE_S = 120.0  # every request's whole life, start to last byte
RECOVERY_BOUND_S = 180.0  # a killed engine's server answers /health 200 again within this


class Violation(Exception):
    """An answer the server must never give."""


@dataclass
class Outcome:
    server: str
    call: str
    result: str  # ok | unavailable | error_event | rejected | abandoned | VIOLATION: ...
    latency_s: float
    t_s: float  # start, seconds since the load began


# ------------------------------------------------------------------------------------------ classification


def unavailable(r: httpx.Response) -> str:
    """A 503 must be ``stage_unavailable`` with a ``Retry-After`` (the stage is restarting)."""
    err = r.json().get("error", {})
    if err.get("code") != "stage_unavailable" or not r.headers.get("retry-after"):
        raise Violation(f"503 without stage_unavailable + Retry-After: {r.text[:200]}")
    return "unavailable"


def valid_json(r: httpx.Response, check: Callable[[httpx.Response], bool]) -> str:
    if r.status_code == 200:
        if not check(r):
            raise Violation(f"200 with an unexpected body: {r.content[:200]!r}")
        return "ok"
    if r.status_code == 503:
        return unavailable(r)
    raise Violation(f"valid request answered {r.status_code}: {r.text[:200]}")


def sse_events(r: httpx.Response) -> list[Any]:
    """Every ``data:`` event of a stream read to its end (``"[DONE]"`` kept as the string)."""
    events = []
    for line in r.iter_lines():
        if line.startswith("data: "):
            data = line[6:]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def valid_stream(r: httpx.Response, done: Callable[[list[Any]], bool]) -> str:
    """A started stream ends either as ``done`` says it completed, or with one ``stage_unavailable`` error
    event; a stream that just stops (or errors otherwise) is a violation."""
    if r.status_code != 200:
        r.read()
        return valid_json(r, lambda _: False)
    try:
        events = sse_events(r)
    except httpx.HTTPError as e:
        raise Violation(f"stream broke off without an error event ({type(e).__name__}: {e})") from None
    errors = [e["error"] for e in events if isinstance(e, dict) and "error" in e]
    if errors:
        if errors[0].get("code") != "stage_unavailable" or len(errors) != 1:
            raise Violation(f"stream error event {errors}")
        return "error_event"
    if not done(events):
        raise Violation(f"stream ended silently after {len(events)} events: {events[-2:]}")
    return "ok"


def abandoned(r: httpx.Response) -> str:
    if r.status_code == 503:
        r.read()
        return unavailable(r)
    if r.status_code != 200:
        raise Violation(f"stream answered {r.status_code}")
    for n, _ in enumerate(r.iter_lines()):
        if n >= 2:
            break  # leaving the `with` closes the connection mid-stream: the server must abort everywhere
    return "abandoned"


def rejected(r: httpx.Response, status: int) -> str:
    try:
        body = r.json()
    except ValueError:
        body = None
    if r.status_code != status or not isinstance(body, dict) or set(body) != {"error"}:
        raise Violation(f"bad request answered {r.status_code} (wanted {status}): {r.text[:200]}")
    return "rejected"


# ------------------------------------------------------------------------------------------ request kinds


def chat_stream(model_body: dict[str, Any]) -> Callable[[httpx.Client, int], str]:
    def call(c: httpx.Client, i: int) -> str:
        with c.stream("POST", "/v1/chat/completions", json={**model_body, "stream": True, "seed": i}) as r:
            return valid_stream(
                r,
                lambda ev: (
                    ev[-1:] == ["[DONE]"]
                    and any(
                        isinstance(e, dict) and e.get("choices") and e["choices"][0].get("finish_reason") for e in ev
                    )
                ),
            )

    return call


def speech_sse(body: dict[str, Any]) -> Callable[[httpx.Client, int], str]:
    def call(c: httpx.Client, i: int) -> str:
        with c.stream("POST", "/v1/audio/speech", json={**body, "stream": True, "stream_format": "sse"}) as r:
            return valid_stream(
                r,
                lambda ev: (
                    bool(ev)
                    and isinstance(ev[-1], dict)
                    and ev[-1].get("type") == "speech.audio.done"
                    and ev[-1]["audio_duration_s"] > 0
                ),
            )

    return call


def speech_raw(body: dict[str, Any], whole_bytes: int) -> Callable[[httpx.Client, int], str]:
    """A raw PCM stream (no event framing): it either carries all ``whole_bytes`` or breaks off so the client
    sees it is incomplete (``broken_off``); a shorter body that ends like a complete one is a violation."""

    def call(c: httpx.Client, i: int) -> str:
        with c.stream("POST", "/v1/audio/speech", json={**body, "stream": True, "response_format": "pcm"}) as r:
            if r.status_code != 200:
                r.read()
                return valid_json(r, lambda _: False)
            try:
                n = sum(len(b) for b in r.iter_bytes())
            except httpx.RemoteProtocolError:
                return "broken_off"
        if n != whole_bytes:
            raise Violation(f"raw stream ended cleanly with {n} of {whole_bytes} bytes")
        return "ok"

    return call


def post_json(
    path: str, body: dict[str, Any], check: Callable[[httpx.Response], bool], seed: bool = True
) -> Callable[[httpx.Client, int], str]:
    def call(c: httpx.Client, i: int) -> str:
        return valid_json(c.post(path, json={**body, **({"seed": i} if seed else {})}), check)

    return call


def abandon(path: str, body: dict[str, Any]) -> Callable[[httpx.Client, int], str]:
    def call(c: httpx.Client, i: int) -> str:
        with c.stream("POST", path, json={**body, "stream": True}) as r:
            return abandoned(r)

    return call


def bad(cases: list[tuple[str, dict[str, Any], int]]) -> Callable[[httpx.Client, int], str]:
    """``cases``: (path, httpx request keywords, the status it must get), taken in turn."""

    def call(c: httpx.Client, i: int) -> str:
        path, kw, status = cases[i % len(cases)]
        kw = dict(kw)
        return rejected(c.request(kw.pop("method", "POST"), path, **kw), status)

    return call


def video_job(body: dict[str, Any], poll_s: float = 0.2) -> Callable[[httpx.Client, int], str]:
    """POST /v1/videos and poll to the end: ``completed`` (with content) or failed ``stage_unavailable``."""

    def call(c: httpx.Client, i: int) -> str:
        r = c.post("/v1/videos", json={**body, "seed": i})
        if r.status_code != 200:
            return valid_json(r, lambda _: False)
        job, start = r.json(), time.monotonic()
        while job["status"] in ("queued", "in_progress"):
            if time.monotonic() - start > DEADLINE_S:
                raise Violation(f"video job {job['id']} still {job['status']} after {DEADLINE_S:.0f} s")
            time.sleep(poll_s)
            job = c.get(f"/v1/videos/{job['id']}").json()
        if job["status"] == "completed":
            content = c.get(f"/v1/videos/{job['id']}/content")
            if content.status_code != 200 or content.content[4:8] != b"ftyp":
                raise Violation(f"completed job without an MP4: {content.status_code}")
            return "ok"
        if job["status"] == "failed" and job["error"]["code"] == "stage_unavailable":
            return "unavailable"
        raise Violation(f"video job ended {job['status']}: {job.get('error')}")

    return call


def b64_images(r: httpx.Response) -> bool:
    data = r.json().get("data") or []
    return len(data) >= 1 and all(base64.b64decode(d["b64_json"])[:4] == b"\x89PNG" for d in data)


# ------------------------------------------------------------------------------------------ the load


@dataclass
class Load:
    """Client threads sending ``calls`` (name -> function, taken round-robin per thread) to one server
    until ``stop()``; every answer becomes an ``Outcome``."""

    server: str
    url: str
    calls: list[tuple[str, Callable[[httpx.Client, int], str]]]
    threads: int = 2
    pause_s: float = 0.05  # between one thread's requests: load, not a busy loop of instant 503s
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.started_at = time.monotonic()  # what every Outcome's t_s counts from
        self._workers = [
            threading.Thread(target=self._run, args=(w,), daemon=True, name=f"load-{self.server}-{w}")
            for w in range(self.threads)
        ]

    def start(self) -> Load:
        for t in self._workers:
            t.start()
        return self

    def _run(self, worker: int) -> None:
        i = worker
        with httpx.Client(base_url=self.url, timeout=httpx.Timeout(DEADLINE_S, connect=10)) as c:
            while not self._stop.is_set():
                name, call = self.calls[i % len(self.calls)]
                t0 = time.monotonic()
                try:
                    result = call(c, i)
                except Violation as e:
                    result = f"VIOLATION: {e}"
                except httpx.TimeoutException as e:
                    result = f"VIOLATION: no answer within {DEADLINE_S:.0f} s ({type(e).__name__})"
                except Exception as e:  # noqa: BLE001 - a client-side failure is a broken answer too
                    result = f"VIOLATION: {type(e).__name__}: {e}"
                latency = time.monotonic() - t0
                if latency > DEADLINE_S and not result.startswith("VIOLATION"):
                    result = f"VIOLATION: took {latency:.1f} s"
                with self._lock:
                    self.outcomes.append(
                        Outcome(self.server, name, result, round(latency, 3), round(t0 - self.started_at, 3))
                    )
                i += self.threads
                self._stop.wait(self.pause_s)

    def stop(self, timeout: float = DEADLINE_S + 30) -> None:
        self._stop.set()
        for t in self._workers:
            t.join(timeout)
            if t.is_alive():
                self.outcomes.append(
                    Outcome(self.server, t.name, "VIOLATION: client thread never returned", timeout, 0.0)
                )


# ------------------------------------------------------------------------------------------ kills


def health(url: str) -> tuple[int, dict]:
    try:
        r = httpx.get(f"{url}/health", timeout=5)
        return r.status_code, r.json()
    except (httpx.HTTPError, ValueError):
        return 0, {}


def wait_healthy(url: str, timeout: float) -> float:
    """Seconds until /health is 200; raises ``Violation`` past ``timeout``."""
    t0 = time.monotonic()
    while health(url)[0] != 200:
        if time.monotonic() - t0 > timeout:
            raise Violation(f"{url} not healthy within {timeout:.0f} s: {health(url)[1]}")
        time.sleep(0.1)
    return time.monotonic() - t0


@dataclass
class Kill:
    server: str
    kind: str
    pid: int
    in_flight: int  # requests the server had in flight at the kill
    saw_unhealthy: bool  # /health said 503 after the kill
    recovery_s: float  # kill -> /health 200 again
    replaced: bool  # a different process of that kind serves afterwards
    error: str | None = None
    at: float = 0.0  # time.monotonic() of the kill


def kill_and_recover(
    server: str,
    url: str,
    root_pid: int,
    kind: str,
    find: Callable[[psutil.Process], list[psutil.Process]],
    min_in_flight: int = 1,
    load_wait_s: float = 30.0,
    settle_s: float = 0.5,
) -> Kill:
    """Once healthy and with load in flight, ``kill -9`` one process ``find`` names; time the recovery."""
    root = psutil.Process(root_pid)
    wait_healthy(url, RECOVERY_BOUND_S)
    t_load = time.monotonic()
    while health(url)[1].get("in_flight", 0) < min_in_flight and time.monotonic() - t_load < load_wait_s:
        time.sleep(0.05)
    time.sleep(settle_s)  # let the requests in flight get going (streams started, batches denoising)
    in_flight = health(url)[1].get("in_flight", 0)
    victims = find(root)
    if not victims:
        return Kill(server, kind, 0, in_flight, False, 0.0, False, error=f"no {kind} process found")
    victim = victims[0]
    os.kill(victim.pid, signal.SIGKILL)
    t0 = time.monotonic()
    kill = Kill(server, kind, victim.pid, in_flight, False, 0.0, False, at=t0)
    saw_unhealthy = False
    while True:
        code, _ = health(url)
        saw_unhealthy |= code == 503
        if code == 200 and saw_unhealthy:  # (a loaded machine may take seconds to notice the death: wait for it)
            break
        if time.monotonic() - t0 > RECOVERY_BOUND_S:
            kill.error = (
                f"not healthy within {RECOVERY_BOUND_S:.0f} s"
                if saw_unhealthy
                else f"/health never said 503 within {RECOVERY_BOUND_S:.0f} s"
            )
            break
        time.sleep(0.05)
    kill.saw_unhealthy, kill.recovery_s = saw_unhealthy, round(time.monotonic() - t0, 2)
    if kill.error is None:
        after = [p.pid for p in find(root)]
        kill.replaced = bool(after) and victim.pid not in after
    return kill


def spanning(outcomes: list[Outcome], started_at: float, kill: Kill) -> dict[str, int]:
    """How the requests that were running at ``kill`` (started before it, ended after) ended: result -> count
    (``started_at``: the load's, that the outcomes' times count from)."""
    counts: dict[str, int] = {}
    for o in outcomes:
        start = started_at + o.t_s
        if o.server == kill.server and start <= kill.at <= start + o.latency_s:
            res = "VIOLATION" if o.result.startswith("VIOLATION") else o.result
            counts[f"{o.call} {res}"] = counts.get(f"{o.call} {res}", 0) + 1
    return dict(sorted(counts.items()))


def summary(outcomes: list[Outcome]) -> dict[str, Any]:
    """Counts per server/call/result, the violations, and the worst latency per call."""
    counts: dict[str, int] = {}
    worst: dict[str, float] = {}
    for o in outcomes:
        res = "VIOLATION" if o.result.startswith("VIOLATION") else o.result
        key = f"{o.server} {o.call} {res}"
        counts[key] = counts.get(key, 0) + 1
        worst[f"{o.server} {o.call}"] = max(worst.get(f"{o.server} {o.call}", 0.0), o.latency_s)
    return {
        "requests": len(outcomes),
        "by_outcome": dict(sorted(counts.items())),
        "max_latency_s": dict(sorted(worst.items())),
        "violations": [asdict(o) for o in outcomes if o.result.startswith("VIOLATION")],
    }
