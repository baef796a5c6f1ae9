"""``omnistage`` command line: serve | generate | bench | pipelines | plan.

Each subcommand lives in its own module exposing ``add_parser(subparsers)``
and ``run(args) -> int``; they are imported lazily so ``omnistage pipelines``
does not pay for importing vLLM.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from omnistage import torchao_gate

# A process an omnistage command started (spawn imports this module through the command's script) hides torchao
# as its parent does (omnistage/torchao_gate.py says why).
torchao_gate.hide_if_inherited()

SUBCOMMANDS = {
    "serve": "omnistage.cli.serve",
    "generate": "omnistage.cli.generate",
    "bench": "omnistage.cli.bench",
    "pipelines": "omnistage.cli.pipelines",
    "plan": "omnistage.cli.plan",
}


def main(argv: list[str] | None = None) -> int:
    from_command_line = argv is None  # not a call from Python (tests): the process is ours to end
    argv = list(sys.argv[1:] if argv is None else argv)
    if from_command_line:  # before anything imports diffusers / transformers
        torchao_gate.hide_unless_named(argv)
    parser = argparse.ArgumentParser(prog="omnistage", description="Serve omni-modality generative pipelines.")
    sub = parser.add_subparsers(dest="command", required=True)
    # Only the chosen subcommand's module is imported (fast --help for the rest).
    chosen = next((a for a in argv if not a.startswith("-")), None)
    modules = {}
    for name, module in SUBCOMMANDS.items():
        if chosen in (None, name) or chosen not in SUBCOMMANDS:
            try:
                modules[name] = importlib.import_module(module)
            except ModuleNotFoundError as e:
                if e.name != module:
                    raise
                continue
            modules[name].add_parser(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    code = int(modules[args.command].run(args) or 0)
    if from_command_line and args.command in EXIT_AT_ONCE:
        exit_now(code)
    return code


# One-shot commands: once their outputs are written and their engine closed, nothing is left to clean up, and
# the interpreter's own teardown of torch / diffusers / transformers modules takes ~2 s (of a ~10 s generate).
EXIT_AT_ONCE = ("generate",)


def exit_now(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
