"""``omnistage bench realtime``: spoken turns over /v1/realtime, sessions at several concurrencies.

Each session streams an utterance in real time (100 ms appends, paced by the clock, as a microphone sends
them), then waits for the answer. Per turn:

- ``first_audio_s``: end of speech -> first ``response.output_audio.delta``. End of speech is the commit
  (manual turns) or, with server VAD, the moment the client sent the sample where the server's
  ``speech_stopped`` says the speech ended (so VAD's ``silence_duration_ms`` wait counts, as a user feels it);
- ``audio_rtf``: ``response.created`` -> last audio delta, over the seconds of audio the answer holds
  (below 1: speech is made faster than it plays);
- a barge-in turn (``--barge-in``): ``response.cancel`` sent on the first audio delta; ``barge_in_s`` is
  cancel -> the last audio delta that still arrived (0 when none did), ``cancel_done_s`` cancel ->
  ``response.done``.

The baseline (manual turns): the same audio turn sent as streamed /v1/chat/completions requests, as many at
once as there were sessions, ``turns`` rounds; request -> first audio chunk. The ratio is what the realtime
path costs over it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from omnistage.bench.metrics import distribution

CHUNK_S = 0.1


@dataclass
class RealtimeConfig:
    url: str  # ws://host:port/v1/realtime?model=...
    clip: np.ndarray  # float32 mono
    rate: int
    api_key: str | None = None
    turns: int = 2
    barge_in: bool = True
    server_vad: bool = False
    session: dict[str, Any] = field(default_factory=dict)  # merged into session.update (e.g. extra_body)
    timeout_s: float = 300.0


@dataclass
class Turn:
    kind: str  # "turn" | "barge_in"
    index: int = 0  # the session's turn number (0: the first, a conversation of one item)
    status: str | None = None
    first_audio_s: float | None = None
    audio_s: float = 0.0
    audio_rtf: float | None = None
    barge_in_s: float | None = None
    cancel_done_s: float | None = None
    deltas_after_cancel: int = 0
    error: str | None = None


def pcm16(x: np.ndarray) -> bytes:
    return np.round(np.clip(x, -1, 1 - 1 / 32768) * 32768).astype("<i2").tobytes()


class Session:
    """One WebSocket session: a reader task timestamps every server event; turns are driven from here."""

    def __init__(self, cfg: RealtimeConfig):
        self.cfg = cfg
        self.events: asyncio.Queue[tuple[float, dict[str, Any]]] = asyncio.Queue()
        self.out_rate: int | None = None
        self.sent = 0  # input samples sent: the session's timeline
        self.sent_at: list[tuple[int, float]] = []  # (samples sent before this append, when)

    async def run(self) -> list[Turn]:
        import websockets

        headers = {"Authorization": f"Bearer {self.cfg.api_key}"} if self.cfg.api_key else {}
        async with websockets.connect(self.cfg.url, additional_headers=headers, max_size=None) as ws:
            self.ws = ws
            reader = asyncio.create_task(self._read())
            try:
                created = await self._expect("session.created")
                fmt = created["session"]["audio"]["output"]["format"]
                self.out_rate = fmt["rate"] if fmt else None
                td = {"type": "server_vad"} if self.cfg.server_vad else None
                update = {
                    "type": "realtime",
                    **self.cfg.session,
                    "audio": {"input": {"format": {"type": "audio/pcm", "rate": self.cfg.rate}, "turn_detection": td}},
                }
                await self._send({"type": "session.update", "session": update})
                await self._expect("session.updated")
                turns = [await self._turn("turn", i) for i in range(self.cfg.turns)]
                if self.cfg.barge_in:
                    turns.append(await self._turn("barge_in", self.cfg.turns))
                return turns
            finally:
                reader.cancel()

    async def _read(self) -> None:
        async for message in self.ws:
            await self.events.put((time.perf_counter(), json.loads(message)))

    async def _send(self, event: dict[str, Any]) -> float:
        await self.ws.send(json.dumps(event))
        return time.perf_counter()

    async def _next(self) -> tuple[float, dict[str, Any]]:
        return await asyncio.wait_for(self.events.get(), self.cfg.timeout_s)

    async def _expect(self, kind: str) -> dict[str, Any]:
        while True:
            _, ev = await self._next()
            if ev["type"] == kind:
                return ev
            if ev["type"] == "error":
                raise RuntimeError(f"server error: {ev['error'].get('message')}")

    async def _stream(self) -> None:
        """The clip, 100 ms at a time, each append sent when its audio would have been spoken."""
        pcm = pcm16(self.cfg.clip)
        step = int(CHUNK_S * self.cfg.rate) * 2
        start = time.perf_counter()
        for k, i in enumerate(range(0, len(pcm), step)):
            await asyncio.sleep(max(0.0, start + k * CHUNK_S - time.perf_counter()))
            self.sent_at.append((self.sent, time.perf_counter()))
            piece = pcm[i : i + step]
            await self._send({"type": "input_audio_buffer.append", "audio": base64.b64encode(piece).decode()})
            self.sent += len(piece) // 2

    def _when_sent(self, ms: int) -> float:
        """When the client sent the sample ``ms`` into the session's timeline (it was in the append sent then,
        plus its place inside that 100 ms piece, as a microphone would have spoken it)."""
        sample = ms * self.cfg.rate // 1000
        first, at = max((s, t) for s, t in self.sent_at if s <= sample) if self.sent_at else (0, 0.0)
        return at + (sample - first) / self.cfg.rate

    async def _turn(self, kind: str, index: int) -> Turn:
        turn = Turn(kind, index)
        streaming = asyncio.create_task(self._stream())
        eos: float | None = None
        if not self.cfg.server_vad:
            await streaming
            await self._send({"type": "input_audio_buffer.commit"})
            eos = await self._send({"type": "response.create"})
        created = first = last = cancel = None
        samples = 0
        try:
            while True:
                at, ev = await self._next()
                kind_ = ev["type"]
                if kind_ == "input_audio_buffer.speech_stopped" and self.cfg.server_vad:
                    eos = self._when_sent(ev["audio_end_ms"])
                elif kind_ == "response.created":
                    created = at
                elif kind_ == "response.output_audio.delta":
                    samples += len(base64.b64decode(ev["delta"])) // 2
                    first = at if first is None else first
                    last = at
                    if cancel is not None:
                        turn.deltas_after_cancel += 1
                    elif kind == "barge_in":
                        cancel = await self._send({"type": "response.cancel"})
                elif kind_ == "error":
                    err = ev["error"]
                    if err.get("code") != "response_cancel_not_active":  # (that one: it ended before the cancel)
                        turn.error = f"{err.get('code')}: {err.get('message')}"
                elif kind_ == "response.done":
                    turn.status = ev["response"]["status"]
                    break
        finally:
            await streaming  # VAD turns: the trailing silence is still being sent
        if first is not None and eos is not None:
            turn.first_audio_s = first - eos
        turn.audio_s = samples / self.out_rate if self.out_rate else 0.0
        if created is not None and last is not None and turn.audio_s:
            turn.audio_rtf = (last - created) / turn.audio_s
        if cancel is not None:
            turn.barge_in_s = max(0.0, (last or cancel) - cancel)
            turn.cancel_done_s = at - cancel
        return turn


async def http_first_audio(cfg: RealtimeConfig, base_url: str, model: str | None) -> float | None:
    """The baseline: the same audio turn as one streamed /v1/chat/completions request sent when the speech
    ends (a client that uploads what was said): request -> first audio chunk."""
    import io

    import httpx
    import soundfile

    wav = io.BytesIO()
    soundfile.write(wav, cfg.clip, cfg.rate, format="WAV", subtype="PCM_16")
    messages = [{"role": "system", "content": cfg.session["instructions"]}] if cfg.session.get("instructions") else []
    messages.append(
        {
            "role": "user",
            "content": [
                {
                    "type": "input_audio",
                    "input_audio": {"data": base64.b64encode(wav.getvalue()).decode(), "format": "wav"},
                }
            ],
        }
    )
    body = {
        "messages": messages,
        "stream": True,
        "modalities": ["text", "audio"],
        **({"model": model} if model else {}),
        **cfg.session.get("extra_body", {}),
    }
    if isinstance(cfg.session.get("max_output_tokens"), int):
        body["max_tokens"] = cfg.session["max_output_tokens"]
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    first = None
    async with httpx.AsyncClient(base_url=base_url, timeout=cfg.timeout_s, headers=headers) as client:
        start = time.perf_counter()
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if first is None and line.startswith("data: {") and '"audio"' in line:
                    chunk = json.loads(line[6:])
                    if any((c.get("delta") or {}).get("audio") for c in chunk.get("choices") or []):
                        first = time.perf_counter() - start
    return first


async def run_level(
    cfg: RealtimeConfig, concurrency: int, baseline_url: str | None = None, model: str | None = None
) -> dict[str, Any]:
    """``concurrency`` sessions at once; their turns and a summary."""
    start = time.perf_counter()
    results = await asyncio.gather(*(Session(cfg).run() for _ in range(concurrency)), return_exceptions=True)
    wall = time.perf_counter() - start
    turns: list[Turn] = []
    failed = []
    for r in results:
        if isinstance(r, BaseException):
            failed.append(f"{type(r).__name__}: {r}")
        else:
            turns.extend(r)
    spoken = [t for t in turns if t.kind == "turn"]
    baseline = None
    if baseline_url is not None:  # as many chat requests at once as there were sessions, one round per turn
        firsts: list[Any] = []
        for _ in range(cfg.turns):
            firsts += await asyncio.gather(
                *(http_first_audio(cfg, baseline_url, model) for _ in range(concurrency)), return_exceptions=True
            )
        baseline = distribution(f for f in firsts if isinstance(f, float))
    barges = [t for t in turns if t.kind == "barge_in" and t.barge_in_s is not None]  # a cancel was sent
    cut = [t for t in barges if t.status == "cancelled"]  # (not those that had finished by then)
    return {
        "concurrency": concurrency,
        "sessions": concurrency,
        "failed_sessions": failed,
        "wall_s": wall,
        "turns_answered": sum(t.status in ("completed", "incomplete") for t in spoken),
        "turns": len(spoken),
        "turn_errors": [t.error for t in turns if t.error],
        "first_audio_s": distribution(t.first_audio_s for t in spoken if t.first_audio_s is not None),
        # first turns only: the conversation the baseline sends (later turns carry the earlier ones)
        "first_audio_turn1_s": distribution(
            t.first_audio_s for t in spoken if t.index == 0 and t.first_audio_s is not None
        ),
        "http_first_audio_s": baseline,  # the baseline: the same turn over /v1/chat/completions
        "audio_rtf": distribution(t.audio_rtf for t in spoken if t.audio_rtf is not None),
        "audio_s_per_answer": distribution(t.audio_s for t in spoken),
        "barge_ins": len(barges),
        "barge_ins_cancelled": len(cut),
        "barge_in_s": distribution(t.barge_in_s for t in cut),
        "cancel_done_s": distribution(t.cancel_done_s for t in cut),
        "deltas_after_cancel": distribution(t.deltas_after_cancel for t in cut),
        "per_turn": [asdict(t) for t in turns],
    }


def markdown(levels: list[dict[str, Any]], title: str) -> str:
    def ms(d: dict[str, float] | None, key: str) -> str:
        return "–" if not d else f"{d[key] * 1000:.0f}"

    def x(d: dict[str, float] | None, key: str) -> str:
        return "–" if not d else f"{d[key]:.2f}"

    lines = [
        f"# {title}",
        "",
        "| sessions | turns answered | end of speech → first audio ms (median / p95) "
        "| first turns: first audio ms (median) | same turn over HTTP chat (median) | ratio "
        "| audio RTF (median / max) "
        "| barge-in: cancel → last delta ms (median / max) | cancel → done ms (median) | cancelled |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lv in levels:
        fa, rtf, bi, cd = lv["first_audio_s"], lv["audio_rtf"], lv["barge_in_s"], lv["cancel_done_s"]
        one, base = lv["first_audio_turn1_s"], lv.get("http_first_audio_s")
        ratio = f"{one['median'] / base['median']:.2f}×" if one and base and base["median"] else "–"
        lines.append(
            f"| {lv['concurrency']} | {lv['turns_answered']}/{lv['turns']} | {ms(fa, 'median')} / "
            f"{ms(fa, 'p95')} | {ms(one, 'median')} | {ms(base, 'median')} | {ratio} "
            f"| {x(rtf, 'median')} / {x(rtf, 'max')} "
            f"| {ms(bi, 'median')} / {ms(bi, 'max')} | {ms(cd, 'median')} "
            f"| {lv['barge_ins_cancelled']}/{lv['barge_ins']} |"
        )
    return "\n".join(lines) + "\n"
