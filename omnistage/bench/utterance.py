"""A speech-like utterance for realtime benchmarks and tests (this project has no speech recordings): a
glottal pulse train through vowel formants, in syllables, between stretches of room noise. WebRTC's voice
activity detector (server VAD) hears it as speech and the noise as silence."""

from __future__ import annotations

import numpy as np


def _resonator(x: np.ndarray, freq: float, bandwidth: float, rate: int) -> np.ndarray:
    """A two-pole resonance (a formant) at ``freq``."""
    r = np.exp(-np.pi * bandwidth / rate)
    a1, a2, gain = -2 * r * np.cos(2 * np.pi * freq / rate), r * r, 1 - r
    y = np.zeros_like(x)
    y1 = y2 = 0.0
    for i, v in enumerate(x):
        y1, y2 = gain * v - a1 * y1 - a2 * y2, y1
        y[i] = y1
    return y


def voiced(seconds: float, rate: int, seed: int = 0) -> np.ndarray:
    """Speech-like sound: a glottal pulse train (~120 Hz, gliding) through three vowel formants, in 4 Hz
    syllables over a faint noise floor. Values are multiples of 1/32768 (PCM16-exact)."""
    n = int(seconds * rate)
    t = np.arange(n) / rate
    f0 = 120 * (1 + 0.1 * np.sin(2 * np.pi * 3 * t))
    x = (np.diff(np.floor(np.cumsum(f0 / rate)), prepend=0) > 0).astype(np.float64)
    for freq, bw in ((700, 130), (1220, 70), (2600, 160)):
        x = _resonator(x, freq, bw, rate)
    x = x * 0.5 * (1 - np.cos(2 * np.pi * 4 * t))
    x = 0.3 * x / np.abs(x).max() + quiet(seconds, rate, seed)
    return (np.round(np.clip(x, -1, 1 - 1 / 32768) * 32768) / 32768).astype(np.float32)


def quiet(seconds: float, rate: int, seed: int = 1) -> np.ndarray:
    """A faint noise floor (a room, not digital silence)."""
    x = 0.002 * np.random.default_rng(seed).standard_normal(int(seconds * rate))
    return (np.round(x * 32768) / 32768).astype(np.float32)


def utterance(speech_s: float, rate: int, before_s: float = 0.5, after_s: float = 1.0) -> tuple[np.ndarray, float]:
    """Room noise, ``speech_s`` of speech, room noise: the clip and where its speech ends (s)."""
    clip = np.concatenate([quiet(before_s, rate), voiced(speech_s, rate), quiet(after_s, rate, seed=2)])
    return clip, before_s + speech_s
