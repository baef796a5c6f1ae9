"""``moshi``: Kyutai's Moshi, full duplex — one ``ar`` stage that steps every live session one 80 ms frame at a time.

Each step: Mimi encodes the user's frame (8 codes), the temporal transformer takes one step over the text token
and the 16 audio codes, the depth transformer draws the model's 8 codes, Mimi decodes them (24 kHz). The engine
(``engine.py``) batches every session whose next frame has arrived; sessions are streams of PCM in, frames out
(``AsyncOmni.open_duplex`` / ``Omni.open_duplex``, see docs/families/moshi.md). A plain request is refused: a
session has no end of its own. A session may take a persona (a voice preset and a text prompt, stepped before its
first frame as NVIDIA's PersonaPlex does: ``persona.py``).

The checkpoint is the authors' layout (``config.json`` with the LM's kwargs and the weight files' names, the LM
and Mimi safetensors). Tiny checkpoint: ``tests/models/moshi/tiny/`` (written by the authors' classes:
``scripts/reference/moshi/make_tiny.py``).
"""

from __future__ import annotations

from typing import Any

from omnistage.info import PipelineInfo
from omnistage.models.moshi.config import is_moshi_config
from omnistage.pipeline import Pipeline, StageSpec, lazy, read_json


def _matches(folder: Any) -> bool:
    return folder.omnistage_pipeline is None and is_moshi_config(read_json(folder.path / "config.json"))


PIPELINE = Pipeline(
    name="moshi",
    description="Moshi: full-duplex speech, every live session stepped one 80 ms frame per engine step (24 kHz)",
    matches=_matches,
    stages=[
        StageSpec(
            0,
            kind="ar",
            knobs="llm",
            name="duplex",
            output="audio",
            final=True,
            engine=lazy("omnistage.models.moshi.engine:build_duplex_engine"),
        ),
    ],
    info=PipelineInfo(chat=False, duplex=True),
)
PIPELINES = [PIPELINE]
TINY: dict[str, Any] = {}  # the tiny checkpoint comes from the reference package: tests/models/moshi/tiny/
