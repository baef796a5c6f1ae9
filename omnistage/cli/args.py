"""Argument types shared by the subcommands."""

from __future__ import annotations

import argparse


def positive_int(value: str) -> int:
    n = int(value)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n
