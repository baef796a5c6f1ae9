"""Servers for the peer clients: the tiny Qwen-Omni fixtures, each one ``omnistage serve`` subprocess per module,
served under one name (a client's ``model: "default"`` is answered as the one model served)."""

from __future__ import annotations

import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

from tests.e2e.servers import serve_tiny

# The thinker's context on the tiny servers: the clients' thinker max_tokens (16384, 2048) are cut to what is left
# of it, as vllm serve does, so a reply is at most this long
CONTEXT = 1024


def speech_that_ends(folder: Path, dest: Path, eos: int) -> Path:
    """A copy of a tiny Qwen-Omni folder whose talker draws its codec end code within tens of frames, as a trained
    talker does; with random weights it almost never does, and the clients' talker budget (4096 codes) is minutes
    of CPU. The end code's row of the talker's codec head is scaled (x3: its logit's spread then reaches the top
    of the others' about one step in ten); everything else is the tiny model as built."""
    shutil.copytree(folder, dest)
    weights = load_file(dest / "model.safetensors")
    weights["talker.codec_head.weight"][eos] *= 3
    save_file(weights, dest / "model.safetensors", metadata={"format": "pt"})
    return dest


def serve_as_default(tiny_model, tmp_path_factory, family: str, name: str, eos: int):
    """``serve_tiny`` with the talker of ``speech_that_ends``; no ``default`` among the served names: the clients
    send it to a plain server."""
    folder = speech_that_ends(tiny_model(family), tmp_path_factory.mktemp(f"{family}-compat") / "model", eos)
    yield from serve_tiny(
        lambda _: folder,
        tmp_path_factory,
        family,
        name,
        "--stage-overrides",
        f'{{"0": {{"max_model_len": {CONTEXT}}}}}',
        "--max-image-pixels",
        str(96 * 96),
    )
