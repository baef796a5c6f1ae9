"""Write a loadable tiny real-architecture model folder for a family.

    python -m omnistage.testing.tiny NAME OUTDIR

Weights are random (seeded), tokenizers are trained locally: no downloads.
The names are those the families export in their ``TINY`` tables.

A builder must write the same bytes on every run: seed, and make sure every parameter is initialised
(transformers 5 leaves some tensors ``torch.empty`` — Qwen3-Omni's talker experts were uninitialised
memory, so some builds held NaN and tests failed depending on what ran before).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def builders() -> dict[str, Callable[[Path], None]]:
    import omnistage.models  # noqa: F401 - registers the built-in families and their builders
    from omnistage.pipeline import tiny_builders

    return tiny_builders()


def build(name: str, outdir: str | Path) -> Path:
    known = builders()
    if name not in known:
        raise ValueError(f"unknown tiny model {name!r}; known: {', '.join(sorted(known))}")
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    known[name](outdir)
    return outdir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m omnistage.testing.tiny", description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(builders()))
    parser.add_argument("outdir")
    args = parser.parse_args(argv)
    print(build(args.name, args.outdir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
