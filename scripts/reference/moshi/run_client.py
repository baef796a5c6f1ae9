"""Drive the authors' command-line client (``moshi.client`` 0.2.13, unchanged) headless against a server's
``/api/chat``, and write what it received.

    python run_client.py URL INPUT.npy OUTPUT.npz [DEADLINE_S]

``moshi.client`` talks to the sound card through ``sounddevice``: here a stand-in module plays INPUT (float32 mono
at 24 kHz, whole 80 ms frames) into the client's microphone callback at real time, one frame per callback as a
sound card does, and never pulls from the client's playback queue, so every frame the client decoded stays there.
URL is what ``--url`` takes (the client appends ``/api/chat``). Once the client decoded one output frame per input
frame after the first (the first only fills the model's delay pattern), the socket is closed and OUTPUT.npz gets
``pcm`` [frames * 1920] (the client's decoded audio) and ``text`` / ``text_frame`` (each text message the client
printed, and how many audio frames it had decoded then: the frame the piece belongs to).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
import types

import numpy as np

FRAME = 1920
PERIOD_S = 0.08


class Microphone:
    """``sounddevice.InputStream`` as the client uses it: calls ``callback(block[frames, 1], frames, time, status)``
    every period from its own thread, with the next frame of the input."""

    pcm: np.ndarray = np.zeros(0, np.float32)
    instance: Microphone | None = None

    def __init__(self, samplerate, channels, blocksize, callback):
        assert (samplerate, channels, blocksize) == (24000, 1, FRAME)
        self.callback = callback
        self.thread = threading.Thread(target=self._play, daemon=True)
        Microphone.instance = self

    def _play(self) -> None:
        for at in range(0, len(self.pcm), FRAME):
            self.callback(self.pcm[at : at + FRAME].reshape(FRAME, 1), FRAME, None, None)
            time.sleep(PERIOD_S)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        return False


class Speaker:
    """``sounddevice.OutputStream``: never pulls, so the client's decoded frames stay in its queue."""

    def __init__(self, samplerate, channels, blocksize, callback):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


sys.modules["sounddevice"] = types.SimpleNamespace(InputStream=Microphone, OutputStream=Speaker)

from moshi import client  # noqa: E402  (after the stand-in sound card is in place)
from moshi.client_utils import RawPrinter  # noqa: E402


class Recorder(RawPrinter):
    """The client's printer: each text piece with the number of frames decoded when it came."""

    def __init__(self):
        super().__init__()
        self.pieces: list[tuple[int, str]] = []

    def print_token(self, token: str):
        self.pieces.append((decoded_frames(), token))


def connection():
    mic = Microphone.instance
    return None if mic is None else mic.callback.__self__  # the client's Connection (the callback's owner)


def decoded_frames() -> int:
    conn = connection()
    return 0 if conn is None else conn._output_queue.qsize()


async def main(url: str, want: int, deadline_s: float, printer: Recorder) -> None:
    session = asyncio.create_task(client.run(printer, argparse.Namespace(url=url, host=None, port=None, https=False)))
    end = time.monotonic() + deadline_s
    while decoded_frames() < want:
        if session.done():
            session.result()  # the client gave up: raise why
            raise SystemExit("the client ended before every frame came back")
        if time.monotonic() > end:
            raise SystemExit(f"deadline: {decoded_frames()} of {want} frames after {deadline_s} s")
        await asyncio.sleep(0.05)
    await connection().websocket.close()
    await asyncio.wait_for(session, 30)


if __name__ == "__main__":
    url, source, out = sys.argv[1:4]
    deadline = float(sys.argv[4]) if len(sys.argv) > 4 else 300.0
    Microphone.pcm = np.load(source).astype(np.float32)
    recorder = Recorder()
    frames = len(Microphone.pcm) // FRAME - 1
    asyncio.run(main(url, frames, deadline, recorder))
    queue = connection()._output_queue
    pcm = np.concatenate([queue.get() for _ in range(queue.qsize())])
    text_frame = np.array([f for f, _ in recorder.pieces], dtype=np.int64)
    np.savez(out, pcm=pcm, text=np.array([t for _, t in recorder.pieces]), text_frame=text_frame)
    print(f"{len(pcm) // FRAME} frames, {len(recorder.pieces)} text pieces")
