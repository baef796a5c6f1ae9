"""CPU thread settings for each vLLM engine, so that several engines in one
process (and the diffusion/generation engines beside them) do not spin their
OpenMP pools against each other on the same cores.

vLLM's CPU worker reads ``VLLM_CPU_OMP_THREADS_BIND`` / ``OMP_NUM_THREADS``
from the environment when its process is spawned, so the variables are set
only around the engine's construction (one construction at a time) and then
restored.

Rules, on the CPU platform only (GPU engines are left alone):
- ``devices`` of an llm stage name CPU core ids there: the engine's OpenMP
  threads are bound to them (split evenly across tensor-parallel ranks);
- else ``num_threads`` gives the thread count, without binding;
- else the first engine of the process keeps vLLM's default (bind all cores),
  and every further engine gets one unbound thread.
A variable the user exported wins over all of these.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_live_engines = 0


def cpu_thread_env(devices: list[str] | None, num_threads: int | None, tp_size: int) -> dict[str, str]:
    env: dict[str, str] = {}
    if devices:
        if len(devices) % tp_size:
            raise ValueError(f"devices: {len(devices)} cores do not split over tensor_parallel_size={tp_size}")
        per = len(devices) // tp_size
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(",".join(devices[i * per : (i + 1) * per]) for i in range(tp_size))
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
        env["OMP_NUM_THREADS"] = str(num_threads or per)
    elif num_threads is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        env["OMP_NUM_THREADS"] = str(num_threads)
    elif _live_engines > 0:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        env["OMP_NUM_THREADS"] = "1"
    return {k: v for k, v in env.items() if k not in os.environ}


@contextlib.contextmanager
def engine_env(
    devices: list[str] | None, num_threads: int | None, tp_size: int, is_cpu: bool
) -> Iterator[dict[str, str]]:
    """Hold the construction lock, set this engine's variables, restore them afterwards."""
    global _live_engines
    with _lock:
        env = cpu_thread_env(devices, num_threads, tp_size) if is_cpu else {}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            yield env
            _live_engines += 1
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def engine_closed() -> None:
    global _live_engines
    with _lock:
        _live_engines = max(0, _live_engines - 1)
