"""Shared by the voxcpm tests: the tiny folder and the goldens of OpenBMB's ``voxcpm`` 2.0.3 on it.

The release's package runs in its own environment (it imports torchaudio, which has no build for this torch, and
librosa): ``scripts/reference/voxcpm/setup.sh`` (about a minute; the venv lives outside the repo) builds the
same tiny folder and writes ``golden/`` with ``run_reference.py``: per case (``plain``, ``clone``: a clip and its
transcript, ``reference``: a clip alone) the release's whole waveform, its streamed chunks joined, the generated
latent patches, and the inputs; each case ran twice, bit-identical. ``golden/weights.json`` holds the sha256 of
the weights the goldens came from; the ``voxcpm_dir`` fixture checks this session's tiny build against it (a
different build means: rerun the script).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

GOLDEN = Path(__file__).parent / "golden"
STEP = 1 / 32768  # one 16-bit step
CASES = ("plain", "clone", "reference")


def golden(name: str) -> dict[str, np.ndarray]:
    return dict(np.load(GOLDEN / f"{name}.npz"))


def speech_of(case: str) -> dict | None:
    """The request's speech fields of a golden case (the clip at its 16 kHz)."""
    g = golden(case)
    if case == "clone":
        return {"ref_audio": (g["clip"], 16000), "ref_text": str(g["clip_text"])}
    if case == "reference":
        return {"ref_audio": (g["clip"], 16000)}
    return None


@pytest.fixture(scope="session")
def voxcpm_dir(tiny_model):
    folder = tiny_model("voxcpm")
    for name, digest in json.loads((GOLDEN / "weights.json").read_text()).items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, (
            f"{name} differs from the weights the goldens came from: rerun scripts/reference/voxcpm/setup.sh"
        )
    return folder
