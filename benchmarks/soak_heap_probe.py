"""What grows in the Wan video server of benchmarks/soak.py: the same server in this process (tiny Wan behind
``serve_engine``), 100 warm-up requests of the soak's video mix, then N more under ``tracemalloc``; prints RSS,
the traced Python heap, its largest growths, and RSS after ``malloc_trim(0)`` (memory glibc held but had freed).
Run it alone, or with ``MALLOC_ARENA_MAX=2`` to compare; numbers in benchmarks/results/soak_10000.md.

    python benchmarks/soak_heap_probe.py [N=200]
"""

import ctypes
import gc
import os
import sys
import tempfile
import tracemalloc
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import httpx  # noqa: E402
import psutil  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import soak_mix  # noqa: E402

KINDS = soak_mix.MIX["video"]


def main() -> None:
    from omnistage import AsyncOmni
    from omnistage.testing.server import serve_engine
    from omnistage.testing.tiny import build

    torch.set_num_threads(1)
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    work = Path(tempfile.mkdtemp(prefix="omnistage-heap-probe-"))
    os.environ["OMNISTAGE_SERVER_STORAGE__PATH"] = str(work / "storage")
    srv = serve_engine(AsyncOmni(str(build("wan", work / "wan"))), served_model_name="tiny-wan", ready_timeout=300)
    proc = psutil.Process()

    def rss() -> float:
        return round(proc.memory_info().rss / 2**20, 1)

    def batch(count: int, start: int) -> None:
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            for i in range(start, start + count):
                kind, ok = KINDS[i % len(KINDS)](c, i)
                assert ok, kind

    batch(100, 0)
    print("RSS after warm-up", rss(), "MiB", flush=True)
    tracemalloc.start(25)
    before, r0 = tracemalloc.take_snapshot(), rss()
    for j in range(4):
        batch(n // 4, 100 + j * n // 4)
        print(
            f"+{(j + 1) * n // 4} requests: RSS {rss()} MiB, traced heap {tracemalloc.get_traced_memory()[0] >> 10} KiB",
            flush=True,
        )
    gc.collect()
    after = tracemalloc.take_snapshot()
    print(f"RSS {r0} -> {rss()} MiB over {n} requests; largest heap growths:")
    for stat in after.compare_to(before, "traceback")[:6]:
        print(f"  {stat.size_diff >> 10} KiB in {stat.count_diff} blocks at", stat.traceback.format()[-2].strip())
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    print("RSS after malloc_trim(0)", rss(), "MiB")
    srv.stop()


if __name__ == "__main__":
    main()
