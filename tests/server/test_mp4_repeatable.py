"""encode_mp4 gives the same bytes for the same frames, whatever is in the process's heap.

x264's defaults (MB-tree rate control) read uninitialised heap memory on some content, so a long-running server
encoded one video differently from one request to the next. glibc's ``MALLOC_PERTURB_`` fills freed and new heap
blocks with a chosen byte: each subprocess below encodes the same clip under a different fill byte. With x264's
defaults this clip gives three different bitstreams.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="MALLOC_PERTURB_ is a glibc feature")

# a bright blob moving across a dark frame, 33 frames of 48x32: content on which x264's defaults vary
_ENCODE = """
import hashlib, sys
import numpy as np
from omnistage.server.media import encode_mp4
T, H, W = 33, 32, 48
t = np.arange(T)[:, None, None, None] / T
y = np.linspace(0, 1, H)[None, :, None, None]
x = np.linspace(0, 1, W)[None, None, :, None]
clip = 255 * np.exp(-((x - t) ** 2 + (y - 0.5) ** 2) * 20) * np.array([1.0, 0.6, 0.3]) + 30
frames = np.broadcast_to(np.clip(clip, 0, 255), (T, H, W, 3)).astype(np.uint8)
sys.stdout.write(hashlib.sha256(encode_mp4(frames, 8)).hexdigest())
"""


def test_same_frames_same_bytes_whatever_the_heap_holds():
    digests = []
    for fill in ("1", "77", "165"):
        env = {**os.environ, "MALLOC_PERTURB_": fill}
        out = subprocess.run(
            [sys.executable, "-c", _ENCODE], env=env, capture_output=True, text=True, timeout=120, check=True
        )
        digests.append(out.stdout)
    assert len(set(digests)) == 1, digests
