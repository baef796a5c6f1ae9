"""Write a loadable tiny real-architecture model folder for a family.

    python -m omnistage.testing.tiny FAMILY OUTDIR

Weights are random (seeded), tokenizers are trained locally: no downloads.
Each family provides ``build(outdir: Path) -> None`` in its own module.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

BUILDERS = {
    "sd3": "omnistage.models.sd3.tiny:build",
    "sd15": "omnistage.models.sd.tiny:build_sd15",
    "sdxl": "omnistage.models.sd.tiny:build_sdxl",
    "chat": "omnistage.models.chat.tiny:build",
    "glm_image": "omnistage.models.glm_image.tiny:build",
    "codec_tts": "omnistage.models.codec_tts.tiny:build",
    "wan": "omnistage.models.wan.tiny:build",
}


def build(family: str, outdir: str | Path) -> Path:
    if family not in BUILDERS:
        raise ValueError(f"unknown tiny family {family!r}; known: {', '.join(sorted(BUILDERS))}")
    module, _, fn = BUILDERS[family].partition(":")
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    getattr(importlib.import_module(module), fn)(outdir)
    return outdir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m omnistage.testing.tiny", description=__doc__.splitlines()[0])
    parser.add_argument("family", choices=sorted(BUILDERS))
    parser.add_argument("outdir")
    args = parser.parse_args(argv)
    print(build(args.family, args.outdir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
