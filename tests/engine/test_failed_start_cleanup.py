"""A stage that fails to start stops the stages started before it, whatever their kind, and leaves no process
of its own: tiny GLM-Image (a vLLM ``llm`` stage with its engine core and worker, then a ``diffusion`` stage in
an ``mp`` child) and tiny CSM (an ``ar`` stage in an ``mp`` child, then a ``generation`` stage), the second
stage each time reading a copy of the model whose weight files are corrupt. And a stage restarting after a
crash whose restart fails: no process of the failed attempt stays, and the stop ends the rest. (A
``generation`` stage in an ``mp`` child started before a failing one: tests/engine/test_process_mode.py.)
Deadlines here stop a hang only."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
from pathlib import Path

import psutil
import pytest

from omnistage import AsyncOmni

pytestmark = [pytest.mark.slow]


def corrupt_copy(folder: Path, dest: Path) -> Path:
    """The model folder with every weight file overwritten by bytes no loader accepts."""
    shutil.copytree(folder, dest)
    for f in dest.rglob("*.safetensors"):
        f.write_bytes(b"not a safetensors file" * 64)
    return dest


def command(p: psutil.Process) -> str | None:
    """Its command line; None once it has ended (a zombie included)."""
    try:
        return None if p.status() == psutil.STATUS_ZOMBIE else " ".join(p.cmdline())
    except psutil.Error:
        return None


def children() -> list[psutil.Process]:
    """This process's running children, but multiprocessing's resource tracker (it serves this process until
    it exits)."""
    return [
        p
        for p in psutil.Process().children(recursive=True)
        if (cmd := command(p)) is not None and "resource_tracker" not in cmd
    ]


async def no_children_left(before: set[int], timeout: float = 30.0) -> list[str]:
    """This process's children not in ``before`` still running ``timeout`` s later (the deadline)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        left = [p for p in children() if p.pid not in before]
        if not left or asyncio.get_running_loop().time() > deadline:
            return [f"{p.pid} {(command(p) or '(ended)')[:80]}" for p in left]
        await asyncio.sleep(0.2)


@pytest.mark.vllm
async def test_a_failed_diffusion_stage_stops_the_started_vllm_stage(tiny_model, tmp_path, caplog):
    caplog.set_level(logging.INFO, "omnistage.engine.builder")
    folder = tiny_model("glm_image")
    bad = corrupt_copy(folder, tmp_path / "bad")
    before = {p.pid for p in children()}
    engine = AsyncOmni(
        str(folder),
        enforce_eager=True,
        stage_overrides={"1": {"model": str(bad), "process": "mp"}},
    )
    with pytest.raises(Exception):  # noqa: B017,PT011 - whatever the loader says of the corrupt weights
        await engine.start()
    assert "stage 0 (ar) ready" in caplog.text and "stage 1" not in caplog.text  # the vLLM stage had started
    assert await no_children_left(before) == []  # the engine core (and worker), the failed mp child


async def test_a_failed_generation_stage_stops_the_started_ar_stage(tiny_model, tmp_path, caplog):
    caplog.set_level(logging.INFO, "omnistage.engine.builder")
    folder = tiny_model("csm")
    bad = corrupt_copy(folder, tmp_path / "bad")
    before = {p.pid for p in children()}
    engine = AsyncOmni(str(folder), stage_overrides={"0": {"process": "mp"}, "1": {"model": str(bad)}})
    with pytest.raises(Exception):  # noqa: B017,PT011 - whatever the loader says of the corrupt weights
        await engine.start()
    assert "stage 0 (backbone) ready" in caplog.text and "stage 1" not in caplog.text  # the ar stage had started
    assert await no_children_left(before) == []  # the ar stage's mp child


async def test_a_stop_while_restarts_fail_leaves_no_process(tiny_model, tmp_path):
    """The ``ar`` stage's ``mp`` child killed after its weights went bad: its restarts fail while loading; a
    stop then (between two attempts or during one) ends every process of the engine."""
    model = tmp_path / "csm"
    shutil.copytree(tiny_model("csm"), model)
    before = {p.pid for p in children()}
    engine = AsyncOmni(str(model), stage_overrides={"0": {"process": "mp"}, "1": {"process": "mp"}})
    await engine.start()
    try:
        [replica] = engine.replicas(0)
        child = replica.pid
        for f in model.rglob("*.safetensors"):
            f.write_bytes(b"not a safetensors file" * 64)
        os.kill(child, signal.SIGKILL)
        async with asyncio.timeout(120):
            while "restart failed" not in replica.stats().detail:  # the first restart has failed
                await asyncio.sleep(0.2)
    finally:
        await asyncio.wait_for(engine.shutdown(), 60)
    assert await no_children_left(before) == []
