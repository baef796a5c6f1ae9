"""Output modalities and how their payloads accumulate when a stage streams deltas.

This module is the single place that knows the canonical modality names
and which of them are drained by streaming; configuration, the orchestrator and the server all call
``OutputModality.parse``.
"""

from __future__ import annotations

import enum
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


class OutputModality(enum.Flag):
    TEXT = enum.auto()
    IMAGE = enum.auto()
    AUDIO = enum.auto()
    VIDEO = enum.auto()
    LATENT = enum.auto()
    TOKEN_IDS = enum.auto()
    ACTION = enum.auto()  # a robot's action chunk: float [steps, action width], with its domain and step rate

    @classmethod
    def canonical_names(cls) -> list[str]:
        return [m.name.lower() for m in cls]

    @classmethod
    def parse(cls, value: str | OutputModality | None) -> OutputModality:
        """Parse ``"text"``, ``"text+audio"``, ``"image,latent"``...; ``None`` means text.

        Strict on purpose: a typo in a deploy file must fail at start-up, not
        silently produce the wrong stage wiring.
        """
        if value is None:
            return cls.TEXT
        if isinstance(value, cls):
            return value
        if not isinstance(value, str):
            raise ValueError(_bad(value, "expected a string"))
        hit = _PARSED.get(value)  # called per streamed delta: remember valid strings
        if hit is not None:
            return hit
        if value == "":
            raise ValueError(_bad(value, "empty value"))
        result = cls(0)
        for part in re.split(r"[+,]", value):
            if part == "":
                raise ValueError(_bad(value, "empty component"))
            member = _BY_NAME.get(part)
            if member is None:
                raise ValueError(_bad(value, f"unknown output type {part!r}"))
            result |= member
        _PARSED[value] = result
        return result

    def names(self) -> list[str]:
        """Canonical names of the members set in this flag, in declaration order."""
        names = _NAMES.get(self._value_)
        if names is None:
            names = _NAMES[self._value_] = [m.name.lower() for m in type(self) if m in self]
        return list(names)

    def __str__(self) -> str:
        return "+".join(self.names())

    @property
    def key(self) -> str:
        """Default payload key of a single modality (its canonical name)."""
        names = self.names()
        if len(names) != 1:
            raise ValueError(f"{self!s} is not a single modality")
        return names[0]


_BY_NAME = {m.name.lower(): m for m in OutputModality}
# Caches for the per-delta hot path (flag values and valid strings never change meaning).
_PARSED: dict[str, OutputModality] = {}
_NAMES: dict[int, list[str]] = {}


def _bad(value: Any, why: str) -> str:
    return (
        f"invalid output type {value!r} ({why}); expected one of "
        f"{', '.join(OutputModality.canonical_names())}, or several joined by '+' or ','"
    )


# --------------------------------------------------------------------------- accumulation

Payload = Any


@dataclass(frozen=True)
class AccumulationRule:
    """How the deltas of one payload key join into the whole value: ``join`` gets every delta so far,
    in order, and is called once per assembly (never per delta: that would be quadratic)."""

    join: Callable[[list[Payload]], Payload]


def _concat(dim: int) -> Callable[[list[Payload]], Payload]:
    def join(parts: list[Payload]) -> Payload:
        if all(isinstance(p, list) for p in parts):
            return list(itertools.chain.from_iterable(parts))
        if any(isinstance(p, np.ndarray) for p in parts):
            return np.concatenate([np.asarray(p) for p in parts], axis=dim)
        tensors = [p if isinstance(p, torch.Tensor) else torch.as_tensor(p) for p in parts]
        return torch.cat([t.to(tensors[0].device) for t in tensors], dim=dim)

    return join


def _append(parts: list[Payload]) -> Payload:
    """Text joins; tensors concatenate on dim 0; anything else is a list of items (a lone value as it is)."""
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], str):
        return "".join(parts)
    if isinstance(parts[0], torch.Tensor):
        return torch.cat(parts, dim=0)
    return [x for p in parts for x in (p if isinstance(p, (list, tuple)) else [p])]


def _keep_last(parts: list[Payload]) -> Payload:
    return parts[-1]


DEFAULT_RULES: dict[str, AccumulationRule] = {
    "text": AccumulationRule(_append),
    "token_ids": AccumulationRule(_concat(0)),
    "latent": AccumulationRule(_concat(0)),
    "image": AccumulationRule(_append),
    "audio": AccumulationRule(_concat(-1)),
    "video": AccumulationRule(_concat(0)),
    "action": AccumulationRule(_concat(0)),  # chunks of steps join in time
}
# Scalars that travel beside a payload: the newest value wins (``action_domain``: the embodiment the actions
# are for; ``action_fps``: action steps per second; ``revised_prompt``: the prompt a stage drew from after
# rewriting the caller's).
SIDE_KEYS = ("sample_rate", "fps", "num_steps", "action_domain", "action_fps", "revised_prompt")
_SIDE_RULE = AccumulationRule(_keep_last)
_AUX_RULE = AccumulationRule(_append)  # unknown auxiliary keys: a list of items
# Producer keys that mean "the stage's main output".
GENERIC_KEYS = ("model_outputs", "hidden")


def normalize_keys(
    data: dict[str, Payload],
    default_key: str,
    rules: dict[str, AccumulationRule] | None = None,
) -> dict[str, Payload]:
    """Rename generic producer keys to the stage's declared default key.

    Explicit keys are kept as they are (two auxiliary outputs need two names);
    a key with a family-registered rule is always explicit. Values are passed
    through untouched.
    """
    rules = rules or {}
    out: dict[str, Payload] = {}
    for key, value in data.items():
        target = default_key if key in GENERIC_KEYS and key not in rules else key
        if target in out:
            raise ValueError(f"producer returned both {key!r} and {target!r}; name auxiliary outputs explicitly")
        out[target] = value
    return out


class OutputAccumulator:
    """Keeps a stage's streamed deltas by key and assembles the whole value on demand.

    ``add`` only appends a reference (O(1) per delta); ``whole()`` joins each key's deltas
    with its rule once and keeps the joined value, so asking again costs nothing until more
    deltas arrive. Side keys (``sample_rate``, ``fps``) keep their newest value.
    """

    def __init__(self, rules: dict[str, AccumulationRule] | None = None):
        self._rules = {**DEFAULT_RULES, **(rules or {})}
        self._parts: dict[str, list[Payload]] = {}

    def rule(self, key: str) -> AccumulationRule:
        if key in self._rules:
            return self._rules[key]
        return _SIDE_RULE if key in SIDE_KEYS else _AUX_RULE

    def add(self, delta: dict[str, Payload]) -> None:
        for key, value in delta.items():
            if value is not None:
                self._parts.setdefault(key, []).append(value)

    def get(self, key: str) -> Payload:
        """The whole value of one key (None if it never arrived)."""
        parts = self._parts.get(key)
        if not parts:
            return None
        if len(parts) > 1:
            parts[:] = [self.rule(key).join(parts)]
        return parts[0]

    def whole(self) -> dict[str, Payload]:
        return {key: self.get(key) for key in self._parts}
