"""Shared by the moshi tests: the tiny checkpoint and the goldens of the authors' package.

Both come from ``moshi`` 0.2.13 (it pins torch<2.10 and numpy<2.3, so it runs in its own venv):
``scripts/reference/moshi/setup.sh`` builds that venv, writes the tiny checkpoint with the authors' classes
(``tiny/``, committed: the tests load exactly what the reference loaded, SentencePiece tokenizer included) and
runs the authors' step loop (``moshi.server``'s per-frame Mimi encode -> ``LMGen.step`` -> Mimi decode) on fixed
input signals: four greedy cases (``golden/{a,b,c,d}.npz``) and one sampled with a seed (``golden/s.npz``, its
settings in ``sampled.json``). Each holds ``user_pcm`` (on the 16-bit grid), ``user_codes`` [T, 8], ``tokens``
[T - 1, 9] (text token + 8 codes per output frame), ``pcm`` (the decoded output) and ``text`` (the transcript
moshi.server sends). Regenerate with ``scripts/reference/moshi/setup.sh`` (the venv, ~7 GB with torch's CUDA
libraries, is built once; the run takes about a minute; rebuilding the tiny checkpoint wrote the same weights).

The persona golden (``golden/persona.npz``, ``persona.json``) and the voice preset ``tiny/voices/tiny.pt`` come
from NVIDIA PersonaPlex's fork of ``moshi`` (its ``LMGen.step_system_prompts`` then its step loop, greedy, on
the codes of case "a"): ``scripts/reference/moshi/setup_personaplex.sh`` rebuilds them (a few seconds once that
venv exists; the run is done twice and must agree). ``persona.json`` pins the weights and the preset by hash.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent
TINY = HERE / "tiny"
GOLDEN = HERE / "golden"
CASES = ("a", "b", "c", "d")
GREEDY = {"temperature": 0, "temperature_text": 0}
# the sampled case: the reference seeded torch's global generator; a session draws from its own, seeded alike
SAMPLED = json.loads((GOLDEN / "sampled.json").read_text())
SAMPLED_PARAMS = {
    "temperature": SAMPLED["temp"],
    "temperature_text": SAMPLED["temp_text"],
    "top_k": SAMPLED["top_k"],
    "top_k_text": SAMPLED["top_k_text"],
    "seed": SAMPLED["seed"],
}
# Mimi in transformers' modules against the authors' (another conv / attention kernel order) decodes the same
# codes to samples within 1.2e-6 of the reference's (measured on all four cases; the peaks are ~1.3)
PCM_ATOL = 1e-5


PERSONA = json.loads((GOLDEN / "persona.json").read_text())
PERSONA_PARAMS = {"voice": PERSONA["voice"], "instructions": PERSONA["instructions"]}


def golden(name: str) -> dict[str, np.ndarray]:
    return dict(np.load(GOLDEN / f"{name}.npz"))


@pytest.fixture(scope="session")
def moshi_dir() -> Path:
    return TINY
