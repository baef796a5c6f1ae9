"""Process finders for chaos runs and restart tests: each names one engine kind's processes in a server's
process tree (``psutil``), by the titles vLLM, multiprocessing and Ray give them."""

from __future__ import annotations

import psutil


def _text(p: psutil.Process) -> str:
    try:
        return p.name() + " " + " ".join(p.cmdline())
    except psutil.Error:
        return ""


def _started(p: psutil.Process) -> float:
    try:
        return p.create_time()
    except psutil.Error:
        return float("inf")


def engine_cores(root: psutil.Process) -> list[psutil.Process]:
    """vLLM's engine-core processes (vLLM sets the title ``VLLM::EngineCore``), oldest first."""
    return sorted((p for p in root.children(recursive=True) if "EngineCore" in _text(p)), key=_started)


def stage_children(root: psutil.Process) -> list[psutil.Process]:
    """The ``mp`` stage processes (multiprocessing spawn children that are not vLLM's engine core, which is
    spawned the same way before it renames itself)."""
    return [p for p in root.children(recursive=True) if "spawn_main" in _text(p) and "EngineCore" not in _text(p)]


def ray_stage_actors(root: psutil.Process | None = None) -> list[psutil.Process]:
    """Ray actor processes running an omnistage stage (Ray titles them ``ray::StageActor...``); the actors
    are the raylet's children, not the server's, so every process of the machine is looked at."""
    return [p for p in psutil.process_iter() if _text(p).startswith("ray::StageActor")]


def tree(root_pid: int) -> list[psutil.Process]:
    root = psutil.Process(root_pid)
    return [root, *root.children(recursive=True)]


def left_after(procs: list[psutil.Process], timeout: float = 15) -> list[str]:
    """The processes of ``procs`` still alive ``timeout`` s later (after the server's SIGTERM)."""
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return [f"{p.pid} {_text(p)[:80]}" for p in alive]
