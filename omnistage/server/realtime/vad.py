"""Server voice-activity detection for ``turn_detection: {"type": "server_vad"}``: where a user's turn starts
and stops in the streamed input audio.

The detector is WebRTC's (``webrtcvad-wheels``: a C extension with its model built in, no torch, no
download). Silero's VAD was tried first: it ships its model too, but it is a neural net trained to reject
everything but recorded human speech (synthesised voiced sound scored below 0.1), so it cannot be tested
without speech recordings, which this project has none of; WebRTC's GMM judges voicing per 30 ms frame.

OpenAI's knobs map onto it as: ``threshold`` (0-1) -> WebRTC's aggressiveness 0-3 (higher: louder, clearer
speech needed); a turn starts when 80 % of the last 300 ms of frames are voiced (at the first voiced frame
among them, less ``prefix_padding_ms``) and stops after ``silence_duration_ms`` of unvoiced frames.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

FRAME_MS = 30
START_FRAMES = 10  # 300 ms window to decide a turn started
START_RATIO = 0.8
NATIVE_RATES = (8000, 16000, 32000, 48000)  # what WebRTC's VAD reads; others are resampled to 16 kHz


class VoiceActivity:
    """Feed PCM16 as it arrives; returns ``("start" | "stop", ms)`` events, ms counted from the first sample fed."""

    def __init__(self, rate: int, threshold: float = 0.5, silence_duration_ms: int = 500):
        import webrtcvad

        self._vad = webrtcvad.Vad(min(3, int(threshold * 4)))
        self.rate = rate if rate in NATIVE_RATES else 16000
        self._resample = None
        if rate != self.rate:
            import soxr

            self._resample = soxr.ResampleStream(rate, self.rate, 1, dtype="int16", quality="HQ")
        self._frame_bytes = self.rate * FRAME_MS // 1000 * 2
        self._pending = b""
        self._frames = 0
        self._window: deque[tuple[int, bool]] = deque(maxlen=START_FRAMES)
        self._silence_frames = max(1, math.ceil(silence_duration_ms / FRAME_MS))
        self._silent_run = 0
        self.speaking = False

    def feed(self, pcm: bytes) -> list[tuple[str, int]]:
        if self._resample is not None:
            pcm = self._resample.resample_chunk(np.frombuffer(pcm, dtype="<i2")).astype("<i2").tobytes()
        data = self._pending + pcm
        events: list[tuple[str, int]] = []
        n = len(data) // self._frame_bytes
        for k in range(n):
            frame = data[k * self._frame_bytes : (k + 1) * self._frame_bytes]
            voiced = self._vad.is_speech(frame, self.rate)
            index, self._frames = self._frames, self._frames + 1
            if not self.speaking:
                self._window.append((index, voiced))
                if len(self._window) == START_FRAMES and sum(v for _, v in self._window) >= START_RATIO * START_FRAMES:
                    self.speaking, self._silent_run = True, 0
                    events.append(("start", next(i for i, v in self._window if v) * FRAME_MS))
            elif voiced:
                self._silent_run = 0
            else:
                self._silent_run += 1
                if self._silent_run >= self._silence_frames:
                    self.speaking = False
                    self._window.clear()
                    events.append(("stop", (index - self._silent_run + 1) * FRAME_MS))
        self._pending = data[n * self._frame_bytes :]
        return events
