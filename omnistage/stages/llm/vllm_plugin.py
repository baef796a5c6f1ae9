"""vLLM general plugin (entry point ``vllm.general_plugins``), loaded by vLLM in each of its processes:
a vLLM process started by an omnistage stage (its engine core, the engine core's workers) is tied to
the process that started it, so it ends when that one dies, killed or not (stages/lifetime.py).
Other vLLM processes (``vllm serve`` beside omnistage) are left alone."""

from __future__ import annotations

from omnistage.stages.lifetime import die_with_spawning_parent


def register() -> None:
    die_with_spawning_parent()
