"""vLLM's own offline ``LLM`` on a model folder, in the test process: the reference the family tests compare
with. Its engine is kept from binding this process's threads, and shut down when the block ends."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def offline_llm(folder: str | Path, **engine: Any) -> Iterator[Any]:
    from vllm import LLM

    saved = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    try:
        llm = LLM(str(folder), kv_cache_memory_bytes=64 << 20, **engine)
    finally:
        if saved is None:
            os.environ.pop("VLLM_CPU_OMP_THREADS_BIND")
        else:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = saved
    try:
        yield llm
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
