"""What OmniVoice does to a decoded waveform before returning it: long silences cut and the edges trimmed
(measured on the 16-bit samples, in milliseconds, as the reference package does it through pydub), the level
set (a cloned voice's loudness, else a 0.5 peak), then 0.1 s fades and 0.1 s of silence at each end.

The silence rules, on 16-bit samples at -50 dBFS (an RMS of ``10 ** (-50 / 20) * 32768``):

- a silence is a run of 500 ms windows (sliding by 10 ms) whose RMS is at or under the threshold; the sound
  between silences is kept with up to 500 ms of its silence on each side (halved where two would overlap);
- then the leading and the trailing silence (10 ms blocks under the threshold) are cut to 100 ms.

Positions are whole milliseconds; a slice that reaches the rounded end of the audio is padded with up to
2 ms of zeros, and an RMS is the floor of the square root of the mean square (16-bit audio's usual rules).
"""

from __future__ import annotations

import math

import numpy as np

SILENCE_DB = -50.0
MID_SILENCE_MS = 500  # a silence this long inside the speech is shortened to this much on each side
LEAD_SILENCE_MS = 100
TRAIL_SILENCE_MS = 100
SEEK_MS = 10
PEAK = 0.5  # the level of speech without a reference clip
REF_RMS_FLOOR = 0.1  # a reference clip quieter than this sets the speech's level
PAD_S = FADE_S = 0.1


class _Pcm:
    """16-bit mono samples addressed in milliseconds, with the sums of squares for window RMS."""

    def __init__(self, samples: np.ndarray, rate: int):
        self.x = samples
        self.rate = rate
        self.ms = round(1000 * (samples.size / rate))

    def span(self, start: int, end: int) -> tuple[int, int]:
        start, end = min(start, self.ms), min(end, self.ms)
        return int(start * (self.rate / 1000.0)), int(end * (self.rate / 1000.0))

    def slice(self, start: int, end: int) -> np.ndarray:
        s, e = self.span(start, end)
        out = self.x[s:e]
        if 0 < out.size < e - s:  # the rounded end: padded with zeros, as 16-bit audio tools do
            out = np.concatenate([out, np.zeros(e - s - out.size, dtype=out.dtype)])
        return out

    def rms(self, start: int, end: int) -> int:
        seg = self.slice(start, end).astype(np.float64)
        if seg.size == 0:
            return 0
        return int(math.sqrt(float(np.dot(seg, seg)) / seg.size))


def _db(rms: int) -> float:
    return -math.inf if rms == 0 else 20 * math.log(rms / 32768.0, 10)


def _silences(pcm: _Pcm, min_ms: int, seek: int) -> list[list[int]]:
    if pcm.ms < min_ms:
        return []
    threshold = 10 ** (SILENCE_DB / 20) * 32768.0
    last = pcm.ms - min_ms
    starts = list(range(0, last + 1, seek)) + ([last] if last % seek else [])
    # the window sums, vectorised: squares summed once, each window's [s, e) read from the cumulative sum
    sq = np.concatenate([[0.0], np.cumsum(pcm.x.astype(np.float64) ** 2)])
    silent = []
    for i in starts:
        s, e = pcm.span(i, i + min_ms)
        got = min(e, pcm.x.size) - s
        n = (e - s) if got > 0 else 0
        rms = 0 if n == 0 else int(math.sqrt((sq[s + got] - sq[s]) / n))
        if rms <= threshold:
            silent.append(i)
    if not silent:
        return []
    ranges, begin, prev = [], silent[0], silent[0]
    for i in silent[1:]:
        if i != prev + seek and i > prev + min_ms:
            ranges.append([begin, prev + min_ms])
            begin = i
        prev = i
    ranges.append([begin, prev + min_ms])
    return ranges


def _cut_long_silences(pcm: _Pcm, mid_ms: int) -> np.ndarray:
    silences = _silences(pcm, mid_ms, SEEK_MS)
    if not silences:
        sound = [[0, pcm.ms]]
    elif silences[0] == [0, pcm.ms]:
        sound = []
    else:
        sound, prev = [], 0
        for start, end in silences:
            sound.append([prev, start])
            prev = end
        if silences[-1][1] != pcm.ms:
            sound.append([prev, pcm.ms])
        if sound[0] == [0, 0]:
            sound.pop(0)
    keep = [[s - mid_ms, e + mid_ms] for s, e in sound]
    for a, b in zip(keep, keep[1:]):
        if b[0] < a[1]:
            a[1] = b[0] = (a[1] + b[0]) // 2
    parts = [pcm.slice(max(s, 0), min(e, pcm.ms)) for s, e in keep]
    return np.concatenate(parts) if parts else pcm.x[:0]


def _leading_silence_ms(pcm: _Pcm) -> int:
    t = 0
    while _db(pcm.rms(t, t + SEEK_MS)) < SILENCE_DB and t < pcm.ms:
        t += SEEK_MS
    return min(t, pcm.ms)


def _trim_edges(x: np.ndarray, rate: int, lead_ms: int, trail_ms: int) -> np.ndarray:
    pcm = _Pcm(x, rate)
    pcm = _Pcm(pcm.slice(max(0, _leading_silence_ms(pcm) - lead_ms), pcm.ms), rate)
    back = _Pcm(pcm.x[::-1], rate)
    back = back.slice(max(0, _leading_silence_ms(back) - trail_ms), back.ms)
    return back[::-1]


def remove_silence(
    audio: np.ndarray,
    rate: int,
    mid_ms: int = MID_SILENCE_MS,
    lead_ms: int = LEAD_SILENCE_MS,
    trail_ms: int = TRAIL_SILENCE_MS,
) -> np.ndarray:
    """float32 mono -> float32 mono at 16-bit precision, silences over ``mid_ms`` shortened to it on each side
    and the edges' to ``lead_ms`` / ``trail_ms``."""
    pcm = (audio * 32768.0).clip(-32768, 32767).astype(np.int16)
    out = _trim_edges(_cut_long_silences(_Pcm(pcm, rate), mid_ms), rate, lead_ms, trail_ms)
    return out.astype(np.float32) / 32768.0


def fade_and_pad(audio: np.ndarray, rate: int) -> np.ndarray:
    fade, pad = int(FADE_S * rate), int(PAD_S * rate)
    out = audio.copy()
    k = min(fade, out.size // 2)
    if k > 0:
        out[:k] *= np.linspace(0, 1, k, dtype=np.float32)
        out[-k:] *= np.linspace(1, 0, k, dtype=np.float32)
    silence = np.zeros(pad, dtype=out.dtype)
    return np.concatenate([silence, out, silence])


def post_process(audio: np.ndarray, rate: int, ref_rms: float | None = None) -> np.ndarray:
    """The decoded float32 waveform [T] as the package returns it."""
    out = remove_silence(np.asarray(audio, dtype=np.float32), rate)
    if ref_rms is not None:
        if ref_rms < REF_RMS_FLOOR:
            out = out * ref_rms / REF_RMS_FLOOR
    elif out.size:
        peak = np.abs(out).max()
        if peak > 1e-6:
            out = out / peak * PEAK
    return fade_and_pad(out, rate) if out.size else out
