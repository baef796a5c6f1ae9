"""Where a one-shot ``omnistage generate`` (the built-in demo, one 64x64 image) spends its time, and what ending
the process at once after the image is written saves.

Two ways to run the very same command, alternated so a busy machine hits both alike:

- ``cli``: ``omnistage generate ...`` (``cli/main.py`` ends a one-shot command with ``os._exit`` once its files
  are written and its engine is closed);
- ``teardown``: the same ``main([...])`` called from ``python -c`` (as from Python: the interpreter then tears
  down every module torch / diffusers / transformers loaded, which is what the command line used to pay).

Each run reports its process wall time; one extra ``python -X importtime`` run of the command says which
imports the start-up goes to (cumulative microseconds of the top-level packages).

    python benchmarks/cli_generate_startup.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
PACKAGES = ("torch", "diffusers", "transformers", "omnistage", "vllm", "PIL", "numpy")


def command(out: Path) -> list[str]:
    return ["generate", "--prompt", "a red circle on the left", "--seed", "1", "--output", str(out)]


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - start


def import_times(out: Path) -> dict[str, float]:
    """Cumulative import seconds of the top-level packages (``-X importtime`` of the command)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "omnistage.cli.main", *command(out)],
        env=ENV,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    found: dict[str, float] = {}
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = (part.strip() for part in line[len("import time:") :].split("|"))
        if name in PACKAGES and cumulative.isdigit():
            found[name] = max(found.get(name, 0.0), int(cumulative) / 1e6)
    return found


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    exe = str(Path(sys.executable).with_name("omnistage"))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.png"
        timed([exe, *command(out)])  # warm the page cache and the demo's weights
        runs: dict[str, list[float]] = {"cli": [], "teardown": []}
        for _ in range(args.runs):
            runs["cli"].append(timed([exe, *command(out)]))
            runs["teardown"].append(
                timed(
                    [
                        sys.executable,
                        "-c",
                        f"import sys; from omnistage.cli.main import main; sys.exit(main({command(out)!r}))",
                    ]
                )
            )
        imports = import_times(out)
    cli, teardown = (statistics.median(runs[k]) for k in ("cli", "teardown"))
    report = {
        "runs": runs,
        "median_s": {"cli": cli, "teardown": teardown},
        "ratio_cli_over_teardown": cli / teardown,
        "import_s": imports,
        "cpus": os.cpu_count(),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "cli_generate_startup.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        "# `omnistage generate` start-up (the demo, one 64x64 image)",
        "",
        f"{args.runs} alternating runs each on {os.cpu_count()} CPUs (`benchmarks/cli_generate_startup.py`).",
        "",
        "| way | median wall s | runs |",
        "|---|---|---|",
        f"| `omnistage generate` (ends with `os._exit`) | {cli:.2f} | {', '.join(f'{x:.2f}' for x in runs['cli'])} |",
        f"| the same `main()` from Python (interpreter teardown) | {teardown:.2f} | "
        f"{', '.join(f'{x:.2f}' for x in runs['teardown'])} |",
        "",
        f"Ratio: **{cli / teardown:.2f}×**. Cumulative import seconds (`-X importtime`): "
        + ", ".join(f"{k} {v:.2f}" for k, v in sorted(imports.items(), key=lambda kv: -kv[1]))
        + ".",
    ]
    (RESULTS / "cli_generate_startup.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
