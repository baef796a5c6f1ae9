"""Shared by the omnivoice tests: the tiny checkpoint and the goldens of k2-fsa's ``omnivoice`` package.

Both come from ``omnivoice`` 0.2.1 in its own environment (it imports torchaudio, which has no build for
this torch): ``scripts/reference/omnivoice/setup.sh`` builds the venv, the tiny checkpoint with the
package's own classes (``tiny/``, committed) and ``golden/`` (per case: the request, the prompt's text-row
ids, the target length, the codes [8, T] and the waveform ``generate`` returns; the clone case adds the
reference clip and its codes; ``silence.npz``: the package's silence trimming on noise with gaps). Regenerate with that script (a few minutes on 2 cores; the venv lives
outside the repo).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from omnistage.models.omnivoice.text import language_id

HERE = Path(__file__).parent
TINY = HERE / "tiny"
GOLDEN = HERE / "golden"
CASES = ("auto", "design", "duration", "clone")


def golden(name: str) -> dict[str, np.ndarray]:
    return dict(np.load(GOLDEN / f"{name}.npz"))


def request_of(lm, name: str, seed: int | None = None):
    """The omnistage code request of a reference case, at the target length the reference estimated."""
    g = golden(name)
    target = int(g["target_len"])
    clone = "ref_codes" in g
    prompt, audio_start = lm.prompt(
        str(g["text"]),
        target,
        language=language_id(str(g["language"])),
        instruct=str(g["instruct"]) or None,
        ref_text=str(g["ref_text_used"]) if clone else None,
        ref_codes=torch.from_numpy(g["ref_codes"]) if clone else None,
    )
    seed = int(g["seed"]) if seed is None else seed
    return lm.new_request(prompt, audio_start, target, seed=seed, num_step=int(g["num_step"])), g


@pytest.fixture(scope="session")
def omnivoice_lm():
    from omnistage.models.omnivoice.model import OmniVoiceCodes

    return OmniVoiceCodes(TINY)
