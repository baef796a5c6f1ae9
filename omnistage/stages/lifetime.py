"""Child processes end with the process that started them.

A server or script killed without cleaning up (``kill -9``, the OOM killer) runs no shutdown code, so
its children must notice by themselves: every process omnistage starts (``mp`` stage children, ranks of
a multi-device diffusion replica, vLLM's engine core and its workers) asks the kernel for SIGKILL when
its parent dies (Linux ``PR_SET_PDEATHSIG``), and a watcher thread checks the parent where the kernel
cannot (another OS, or the parent already gone before the signal was armed).

The kernel sends that signal when the *thread* that started the child ends, not the process: so every
such child is started from a daemon thread that lives as long as the process (``run_in_spawner``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

PARENT_POLL_S = 1.0  # how often the watcher thread looks at the parent
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

# The pid of the process that started the children tied to it (``children_die_with_this_process``); a
# child whose parent is that pid ties itself (``die_with_spawning_parent``, omnistage's vLLM plugin).
ENV = "OMNISTAGE_DIE_WITH_PARENT"

_local = threading.local()  # .parent: the pid forked children of this thread tie themselves to


def die_with_parent(parent_pid: int) -> None:
    """End this process (SIGKILL, or ``os._exit`` from a watcher thread) once ``parent_pid`` is no longer
    its parent. Call it first thing in the child."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="omnistage-parent-watch", daemon=True).start()


def die_with_spawning_parent() -> None:
    """In a process started inside ``children_die_with_this_process`` (spawned: its environment names the
    parent), tie it to that parent, and its own children to itself. Elsewhere, or once tied: nothing.

    ``import omnistage`` runs it, so a spawned child is tied within its first second: ``multiprocessing``'s
    spawn imports the parent's main module (a script or CLI that imports omnistage) before anything else,
    while vLLM's own hooks (its plugins, its worker's death pipe) come only after seconds of imports, and a
    vLLM worker whose engine core was killed meanwhile would wait for it forever."""
    want = os.environ.get(ENV)
    if not want or want == str(os.getpid()):
        return
    if os.getppid() == int(want):
        die_with_parent(int(want))
        os.environ[ENV] = str(os.getpid())
    elif not _alive(int(want)):  # the parent died before this child got here: it was started to die with it
        os._exit(1)


def _alive(pid: int) -> bool:
    """Running (a killed process its parent has not yet reaped is a zombie: not running)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (another OS)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True


@contextlib.contextmanager
def children_die_with_this_process() -> Iterator[None]:
    """Inside it, the processes this thread starts end with this process: forked ones at once (an at-fork
    hook), spawned ones that run ``die_with_spawning_parent`` (vLLM's processes, through omnistage's vLLM
    plugin). Use it on a spawner thread (``run_in_spawner``)."""
    old = os.environ.get(ENV)
    os.environ[ENV] = str(os.getpid())  # (process-wide: children other threads start meanwhile are tied too)
    _local.parent = os.getpid()
    try:
        yield
    finally:
        _local.parent = None
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old


def _after_fork_in_child() -> None:
    parent = getattr(_local, "parent", None)
    if parent is not None:  # forked inside children_die_with_this_process (vLLM's "fork" start method)
        die_with_parent(parent)
        _local.parent = os.getpid()  # what this child forks in turn (vLLM's workers) ends with it
        os.environ[ENV] = str(os.getpid())


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Spawner:
    """Threads that run the calls which start child processes and then live as long as the process: an idle
    one takes the next call, and a new one starts only when all are busy (a vLLM engine's construction takes
    seconds; an ``mp`` child's restart does not wait for it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = 0

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            if self._idle == 0:
                self._idle += 1
                threading.Thread(target=self._run, name="omnistage-spawner", daemon=True).start()
            self._idle -= 1
        self._jobs.put((fn, fut))
        return fut

    def _run(self) -> None:
        while True:
            fn, fut = self._jobs.get()
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as e:  # noqa: BLE001 - handed to the caller through the future
                    fut.set_exception(e)
            with self._lock:
                self._idle += 1


_spawner = _Spawner()


def start_in_spawner(fn: Callable[[], T]) -> concurrent.futures.Future[T]:
    """Run ``fn`` (which starts child processes) on one of the process's long-lived spawner threads."""
    return _spawner.submit(fn)


async def run_in_spawner(fn: Callable[[], T]) -> T:
    """``start_in_spawner`` awaited. Cancelling the wait does not stop an ``fn`` already running."""
    return await asyncio.wrap_future(start_in_spawner(fn))
