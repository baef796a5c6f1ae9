"""Write tests/slow_modules.txt from a pytest ``--durations=0`` log: the test modules that took 20 s or more
(setup + call + teardown summed), slowest first. tests/conftest.py runs them first, so that with
``-n 2 --dist loadfile --no-loadscope-reorder`` the last modules to start are short ones and neither worker
idles long at the end (xdist's own reorder sorts by the number of tests, which put the long few-test modules
last).

    python scripts/suite_order.py make-test.log
"""

from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "slow_modules.txt"
MIN_S = 20.0


def main(log: str) -> None:
    seconds: collections.Counter[str] = collections.Counter()
    for line in Path(log).read_text().splitlines():
        m = re.match(r"\s*([\d.]+)s (?:setup|call|teardown)\s+(\S+?)::", line)
        if m:
            seconds[m.group(2)] += float(m.group(1))
    slow = [(s, mod) for mod, s in seconds.most_common() if s >= MIN_S and (OUT.parent.parent / mod).exists()]
    head = f"# test modules of {MIN_S:.0f} s or more, slowest first (scripts/suite_order.py; seconds as measured)\n"
    OUT.write_text(head + "".join(f"{mod}  # {s:.0f}\n" for s, mod in slow))
    print(f"{len(slow)} modules -> {OUT}")


if __name__ == "__main__":
    main(sys.argv[1])
