"""Decoding the MP4s the video routes answer with (PyAV): frames, fps and, when there is a soundtrack, its rate,
channels, duration and samples."""

from __future__ import annotations

import io

import numpy as np


def decode_mp4(data: bytes) -> dict:
    import av

    with av.open(io.BytesIO(data)) as c:
        v = c.streams.video[0]
        frames = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(v)])
        out = {"frames": frames, "fps": float(v.average_rate), "audio": None}
        if c.streams.audio:
            a = c.streams.audio[0]
            out.update(rate=a.rate, channels=a.channels, duration=float(a.duration * a.time_base))
            c.seek(0)
            out["audio"] = np.concatenate([f.to_ndarray() for f in c.decode(a)], axis=1)
    return out
