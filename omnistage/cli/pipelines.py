"""``omnistage pipelines``: list registered pipelines with their stages."""

from __future__ import annotations

import argparse

from omnistage.pipeline import registered_pipelines


def add_parser(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("pipelines", help="list registered pipelines and their stages")


def run(args: argparse.Namespace) -> int:
    import omnistage.models  # noqa: F401 - registers the built-in families

    pipelines = registered_pipelines()
    if not pipelines:
        print("no pipelines registered")
    for name in sorted(pipelines):
        print(pipelines[name].describe())
        print()
    return 0
