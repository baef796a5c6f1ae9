"""Check that two servers returned the same outputs for the same benchmark requests
(so a speed ratio compares equal work). Prints one markdown line.

    python benchmarks/compare_outputs.py LABEL DIR_A DIR_B
"""

from __future__ import annotations

import sys
from pathlib import Path


def compare(a_dir: Path, b_dir: Path) -> tuple[int, int, str]:
    import numpy as np
    from PIL import Image

    names = sorted(p.name for p in a_dir.iterdir() if (b_dir / p.name).exists())
    same, worst = 0, 0
    for name in names:
        a, b = a_dir / name, b_dir / name
        if a.suffix == ".png":
            diff = int(np.abs(np.asarray(Image.open(a), dtype=int) - np.asarray(Image.open(b), dtype=int)).max())
            worst = max(worst, diff)
            same += diff == 0
        else:
            same += a.read_bytes() == b.read_bytes()
    detail = f", max pixel difference {worst}" if any(n.endswith(".png") for n in names) else ""
    return same, len(names), detail


def main(argv: list[str]) -> int:
    label, a_dir, b_dir = argv[1], Path(argv[2]), Path(argv[3])
    same, total, detail = compare(a_dir, b_dir)
    print(f"- {label}: {same}/{total} outputs identical between the two servers{detail}.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
