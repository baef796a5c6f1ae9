"""torchao is importable in an ``omnistage`` command only when the command names it.

diffusers 0.42.1 and transformers 5.x import torchao as soon as they are imported, whenever it is installed (the
``quant`` extra). Under torch 2.13 that prints noise on every start that a user cannot act on: torchao 0.18 (the
newest release; none is built for torch 2.13) registers its enums as pytree constants, which torch 2.13 deprecates
with a warning per enum, and diffusers 0.42.1 looks for torchao tensor classes that 0.18 moved ("Unable to import
`torchao` Tensor objects"). Nothing uses torchao unless a stage quantizes with it.

So a command decides once, before anything imports diffusers or transformers: when nothing it is given names
torchao (its arguments, the deploy YAML and stage overrides they name, the model folder's ``quantization_config``),
torchao is hidden (``sys.modules["torchao"] = None``: Python's imports and ``importlib.util.find_spec`` read it as
"not installed"), in its own process and, through the environment, in the processes it starts. The libraries then
take the path they take without torchao; neither is patched. ``OMNISTAGE_TORCHAO=enabled`` keeps torchao importable
whatever the command says.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

ENV = "OMNISTAGE_TORCHAO"  # "hidden" in the processes of a command that does not name torchao
NAME = "torchao"
_FILE_FLAGS = ("--deploy-config", "--stage-configs-path")


def hide_unless_named(argv: Sequence[str]) -> None:
    """An ``omnistage`` command's first call: hide torchao here and in the processes it starts, unless ``argv``
    names it (directly, in a config file it names, or in the model folder it serves)."""
    if os.environ.get(ENV) == "enabled" or NAME in sys.modules or _named(argv):
        return
    os.environ[ENV] = "hidden"
    _hide_here()


def hide_if_inherited() -> None:
    """In a process an ``omnistage`` command started (a stage, vLLM's engine core): as its parent decided."""
    if os.environ.get(ENV) == "hidden" and NAME not in sys.modules:
        _hide_here()


def require(where: str) -> None:
    """Before quantizing with torchao: a clear error where this process hid it, not a library's ImportError."""
    if sys.modules.get(NAME, False) is None:
        raise RuntimeError(
            f"{where}: torchao quantization was asked for, but this command named torchao nowhere it looks at "
            f"start-up (its arguments, deploy config and model folder), so torchao was not loaded; set {ENV}=enabled"
        )


def _hide_here() -> None:
    if importlib.util.find_spec(NAME) is not None:  # not installed: nothing to hide
        sys.modules[NAME] = None


def _named(argv: Sequence[str]) -> bool:
    texts = list(argv)
    for i, arg in enumerate(argv):
        value = argv[i + 1] if i + 1 < len(argv) else ""
        flag, _, inline = arg.partition("=")
        if flag in _FILE_FLAGS:
            texts.append(_read(Path(inline or value)))
        elif Path(arg).is_dir():  # a model folder: a component saved quantized by torchao
            texts.extend(_read(p) for p in [Path(arg) / "config.json", *Path(arg).glob("*/config.json")])
    return any(NAME in t for t in texts)


def _read(path: Path) -> str:
    try:
        return path.read_text() if path.is_file() else ""
    except (OSError, UnicodeDecodeError):
        return ""
