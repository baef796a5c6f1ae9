import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One engine-core process per vLLM engine, no extra worker process: starts in half the time.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import pytest  # noqa: E402
import torch  # noqa: E402

# Two OpenMP threads on two shared cores made tiny forwards ~30x slower.
torch.set_num_threads(1)

# requires: a test that needs a missing tool or package skips here and fails in CI
pytest_plugins = ["omnistage.testing.fixtures", "omnistage.testing.requires", "tests.shared_servers"]


# Packages whose modules share one expensive package-scoped server: their files are one xdist work unit (one
# worker runs them back to back, so the fixture starts once) and run next to each other without xdist too.
ONE_WORKER = (
    "tests/models/qwen_omni/server/",
    "tests/models/qwen2_5_omni/server/",
    "tests/models/codec_tts/server/",
    "tests/models/moshi/server/",
)


def scope_of(nodeid: str) -> str:
    """The work unit a test belongs to: its file, or its ONE_WORKER package."""
    path = nodeid.split("::", 1)[0]
    return next((pkg for pkg in ONE_WORKER if path.startswith(pkg)), path)


RUN_CACHE = pytest.StashKey[str | None]()


def pytest_configure(config):
    """The run's shared values (omnistage/testing/run_cache.py): made before xdist starts its workers."""
    from omnistage.testing import run_cache

    config.stash[RUN_CACHE] = run_cache.start_run()


def pytest_unconfigure(config):
    from omnistage.testing import run_cache

    run_cache.end_run(config.stash.get(RUN_CACHE, None))


def pytest_collection_modifyitems(config, items):
    """The slowest modules first (tests/slow_modules.txt, scripts/suite_order.py), the rest in collection order:
    with ``--dist loadfile --no-loadscope-reorder`` (make test) the two workers then end close together."""
    from pathlib import Path

    listed = Path(__file__).with_name("slow_modules.txt").read_text().splitlines()
    rank = {line.split("#")[0].strip(): i for i, line in enumerate(listed) if line.split("#")[0].strip()}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # (stable: keeps the rest's order)
    first: dict[str, int] = {}
    for i, item in enumerate(items):
        first.setdefault(scope_of(item.nodeid), i)
    items.sort(key=lambda item: first[scope_of(item.nodeid)])  # a ONE_WORKER package where its slowest file was


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with each ONE_WORKER package as one unit (xdist's own groups by file only)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LoadFileOrPackage(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return LoadFileOrPackage(config, log)


def pytest_collection_finish(session):
    """The GPU-profile pip dry run waits on the network for minutes: it starts now, in the background, and its
    test reads the result (tests/gpu_profile.py)."""
    from tests import gpu_profile

    if not session.config.option.collectonly and any(item.nodeid == gpu_profile.TEST for item in session.items):
        gpu_profile.start()
