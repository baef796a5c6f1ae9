"""Children end with their parent (stages/lifetime.py), checked on real processes: a parent script starts
children the ways omnistage does (a spawned ``mp`` child, a child of a vLLM-like spawned process tied
through the environment, a forked child), prints their pids, and is then killed with SIGKILL; every child
must be gone. And a child started on the spawner thread must outlive the thread that asked for it (the
kernel's parent-death signal follows the thread that started the child). Deadlines stop a hang only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil

GONE_S = 20.0

PARENT = r"""
import json, multiprocessing as mp, os, sys, threading, time
from omnistage.stages import lifetime

def tied_child(parent, conn):
    lifetime.die_with_parent(parent)
    conn.send("armed")  # its parent-death signal is set: the end of the thread that started it would kill it now
    conn.recv()
    conn.send("alive")
    time.sleep(600)

def env_tied_child(queue):
    lifetime.die_with_spawning_parent()  # what omnistage's vLLM plugin runs in vLLM's processes
    grandchild = mp.get_context("spawn").Process(target=env_tied_grandchild)
    grandchild.start()
    queue.put(grandchild.pid)
    time.sleep(600)

def env_tied_grandchild():
    lifetime.die_with_spawning_parent()
    time.sleep(600)

def fork_child():
    pid = os.fork()
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    return pid

if __name__ == "__main__":
    spawn = mp.get_context("spawn")
    conn, child_conn = spawn.Pipe()
    mp_child = spawn.Process(target=tied_child, args=(os.getpid(), child_conn), daemon=True)

    def ask():  # asks for the child, and ends once the child's signal is armed
        lifetime.start_in_spawner(mp_child.start).result()
        child_conn.close()  # the child's end is the child's only: its death reads as EOF here
        assert conn.poll(120) and conn.recv() == "armed"

    # the child must survive the thread that asked for it
    asker = threading.Thread(target=ask)
    asker.start()
    asker.join()

    queue = spawn.Queue()

    def start_env_tied():
        with lifetime.children_die_with_this_process():
            child = spawn.Process(target=env_tied_child, args=(queue,))
            child.start()
            return child

    env_child = lifetime.start_in_spawner(start_env_tied).result()
    grandchild = queue.get(timeout=120)

    def forked():
        with lifetime.children_die_with_this_process():
            return fork_child()

    forked_pid = lifetime.start_in_spawner(forked).result()
    # the asking thread has ended: a child killed with it (SIGKILL, sent as the thread ended) answers nothing
    try:
        conn.send("still there?")
        answered = conn.poll(120) and conn.recv() == "alive"
    except (BrokenPipeError, EOFError):
        answered = False
    pids = {"mp": mp_child.pid, "env": env_child.pid, "env_grandchild": grandchild, "fork": forked_pid}
    print(json.dumps({"pids": pids, "mp_answered_after_the_asker_ended": answered}), flush=True)
    time.sleep(600)
"""


def test_a_killed_parent_takes_every_child_it_started(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line, "the parent script printed nothing"
        report = json.loads(line)
        pids = report["pids"]
        children = {name: psutil.Process(pid) for name, pid in pids.items()}
        alive_before = {name: p.is_running() and p.status() != psutil.STATUS_ZOMBIE for name, p in children.items()}
    except BaseException:
        proc.kill()
        raise
    assert report["mp_answered_after_the_asker_ended"]  # the mp child outlived the thread that asked for it
    assert alive_before == dict.fromkeys(pids, True)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    _, alive = psutil.wait_procs(list(children.values()), timeout=GONE_S)
    for p in alive:
        p.kill()
    assert [p.pid for p in alive] == []


def test_a_child_whose_parent_already_died_exits_at_once():
    """The signal is armed after the fork: a parent that died before that is caught by the pid check."""
    code = (
        "import os, sys\n"
        "from omnistage.stages.lifetime import die_with_parent\n"
        "die_with_parent(int(sys.argv[1]))\n"
        "print('still here', flush=True)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, "1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "still here" not in out.stdout, (out.returncode, out.stdout, out.stderr)


SLOW_STARTER = r"""
import json, multiprocessing as mp, os, sys, time
from omnistage.stages import lifetime  # imports omnistage: what a spawned child of this script runs first

def engine_core(queue, marker):
    # like vLLM's engine core: spawns a worker, then is killed before the worker ran any hook of its own
    worker = mp.get_context("spawn").Process(target=worker_still_starting, args=(marker,))
    worker.start()
    queue.put(worker.pid)
    time.sleep(600)

def worker_still_starting(marker):
    open(marker, "w").close()  # running its own code (vLLM's worker: importing vLLM, for seconds)
    time.sleep(600)  # no lifetime call here: only what importing omnistage did can end this process

if __name__ == "__main__":
    spawn = mp.get_context("spawn")
    queue = spawn.Queue()

    def start():
        with lifetime.children_die_with_this_process():
            core = spawn.Process(target=engine_core, args=(queue, sys.argv[1]))
            core.start()
            return core

    core = lifetime.start_in_spawner(start).result()
    print(json.dumps({"core": core.pid, "worker": queue.get(timeout=120)}), flush=True)
    time.sleep(600)
"""


def test_a_worker_whose_engine_core_dies_before_its_own_hooks_ran_ends_too(tmp_path):
    """A vLLM worker loads omnistage's vLLM plugin only after seconds of imports; an engine core killed before
    that used to leave it waiting forever. Spawning imports the parent's main module first, which imports
    omnistage: that ties the worker to its engine core before anything slow. The worker here runs no hook at all."""
    script = tmp_path / "starter.py"
    script.write_text(SLOW_STARTER)
    marker = tmp_path / "worker-running"
    proc = subprocess.Popen([sys.executable, str(script), str(marker)], stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(proc.stdout.readline() or "{}")
        core, worker = psutil.Process(pids["core"]), psutil.Process(pids["worker"])
        assert worker.ppid() == core.pid
        deadline = time.monotonic() + GONE_S
        while not marker.exists():  # a deadline that stops a hang
            assert time.monotonic() < deadline, "the worker did not start"
            time.sleep(0.05)
        os.kill(core.pid, signal.SIGKILL)
        _, alive = psutil.wait_procs([worker], timeout=GONE_S)
        for p in alive:
            p.kill()
        assert alive == []
    finally:
        proc.kill()
        proc.wait(10)
