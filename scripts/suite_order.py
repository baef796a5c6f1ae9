"""Write tests/slow_modules.txt from a pytest ``--durations=0`` log: the test modules that took 20 s or more
(setup + call + teardown summed), slowest first. tests/conftest.py runs them first, so that with
``-n 2 --dist loadfile --no-loadscope-reorder`` the last modules to start are short ones and neither worker
idles long at the end (xdist's own reorder sorts by the number of tests, which put the long few-test modules
last).

    python scripts/suite_order.py test-artifacts/junit.xml   # what make test writes (every test's total time)
    python scripts/suite_order.py make-test.log              # or a log of pytest --durations=0
"""

from __future__ import annotations

import collections
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "slow_modules.txt"
MIN_S = 20.0


def from_durations(log: Path) -> collections.Counter[str]:
    """Seconds per test module from pytest's ``--durations=0`` lines (setup, call and teardown)."""
    seconds: collections.Counter[str] = collections.Counter()
    for line in log.read_text().splitlines():
        m = re.match(r"\s*([\d.]+)s (?:setup|call|teardown)\s+(\S+?)::", line)
        if m:
            seconds[m.group(2)] += float(m.group(1))
    return seconds


def module_of(classname: str, root: Path) -> str | None:
    """``tests.models.whisper.test_http`` (or ``...test_http.TestClass``) -> ``tests/models/whisper/test_http.py``
    (a file under ``root``)."""
    parts = classname.split(".")
    while parts:
        path = "/".join(parts) + ".py"
        if (root / path).exists():
            return path
        parts.pop()
    return None


def from_junit(xml: Path, root: Path = ROOT) -> collections.Counter[str]:
    """Seconds per test module from pytest's ``--junitxml`` report (a test case's time: its setup, call and
    teardown together)."""
    import xml.etree.ElementTree as ET

    seconds: collections.Counter[str] = collections.Counter()
    for case in ET.parse(xml).iter("testcase"):
        module = module_of(case.get("classname", ""), root)
        if module:
            seconds[module] += float(case.get("time", 0))
    return seconds


def main(log: str) -> None:
    seconds = from_junit(Path(log)) if log.endswith(".xml") else from_durations(Path(log))
    slow = [(s, mod) for mod, s in seconds.most_common() if s >= MIN_S and (OUT.parent.parent / mod).exists()]
    head = f"# test modules of {MIN_S:.0f} s or more, slowest first (scripts/suite_order.py; seconds as measured)\n"
    OUT.write_text(head + "".join(f"{mod}  # {s:.0f}\n" for s, mod in slow))
    print(f"{len(slow)} modules -> {OUT}")


if __name__ == "__main__":
    main(sys.argv[1])
