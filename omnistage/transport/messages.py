"""Control messages between the orchestrator's process and a stage process (mp).

Tagged msgspec Structs: the receiver decodes straight into these types (one
decoder per direction), so a ``StageOutput`` arrives as a ``StageOutput`` with
its metrics, error and progress typed, and a malformed message fails at decode.
"""

from __future__ import annotations

from typing import Any

import msgspec

from omnistage.stages.base import StageOutput, StageRequest, StageStats

# ------------------------------------------------------------------ parent -> stage process


class Generate(msgspec.Struct, tag="generate"):
    request: StageRequest


class Feed(msgspec.Struct, tag="feed"):
    request_id: str
    chunk: dict[str, Any]
    last: bool


class Abort(msgspec.Struct, tag="abort"):
    request_id: str


class Shutdown(msgspec.Struct, tag="shutdown"):
    pass


Command = Generate | Feed | Abort | Shutdown


# ------------------------------------------------------------------ stage process -> parent


class Ready(msgspec.Struct, tag="ready"):
    pass


class StartFailed(msgspec.Struct, tag="start_failed"):
    error: str
    traceback: str = ""


class Output(msgspec.Struct, tag="output"):
    output: StageOutput


class Stats(msgspec.Struct, tag="stats"):
    stats: StageStats


Event = Ready | StartFailed | Output | Stats
