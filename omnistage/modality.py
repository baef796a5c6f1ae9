"""Output modalities and how their payloads accumulate when a stage streams deltas.

This module is the single place that knows the canonical modality names
(SPEC §2); configuration, the orchestrator and the server all call
``OutputModality.parse``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch


class OutputModality(enum.Flag):
    TEXT = enum.auto()
    IMAGE = enum.auto()
    AUDIO = enum.auto()
    VIDEO = enum.auto()
    LATENT = enum.auto()
    TOKEN_IDS = enum.auto()

    @classmethod
    def canonical_names(cls) -> list[str]:
        return [m.name.lower() for m in cls]

    @classmethod
    def parse(cls, value: "str | OutputModality | None") -> "OutputModality":
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
    """How successive deltas of one payload key combine, and whether the
    accumulated value is handed out as a delta (drained) or always whole."""

    combine: Callable[[Payload, Payload], Payload]
    drain: bool


def _concat(dim: int) -> Callable[[Payload, Payload], Payload]:
    def combine(old: Payload, new: Payload) -> Payload:
        if isinstance(old, list) and isinstance(new, list):
            return old + new
        if isinstance(old, np.ndarray) or isinstance(new, np.ndarray):
            return np.concatenate([np.asarray(old), np.asarray(new)], axis=dim)
        old_t = old if isinstance(old, torch.Tensor) else torch.as_tensor(old)
        new_t = new if isinstance(new, torch.Tensor) else torch.as_tensor(new)
        return torch.cat([old_t, new_t.to(old_t.device)], dim=dim)

    return combine


def _append(old: Payload, new: Payload) -> Payload:
    if isinstance(old, str):
        return old + new
    if isinstance(old, torch.Tensor):
        return torch.cat([old, new], dim=0)
    return list(old) + (list(new) if isinstance(new, (list, tuple)) else [new])


def _keep_last(old: Payload, new: Payload) -> Payload:
    return new


DEFAULT_RULES: dict[str, AccumulationRule] = {
    "text": AccumulationRule(_append, drain=True),
    # Downstream stages (e.g. an image-token prior) need the whole sequence.
    "token_ids": AccumulationRule(_concat(0), drain=False),
    "latent": AccumulationRule(_concat(0), drain=False),
    "image": AccumulationRule(_append, drain=True),
    "audio": AccumulationRule(_concat(-1), drain=True),
    "video": AccumulationRule(_concat(0), drain=True),
}
# Scalars that travel beside a payload: the newest value wins and is never drained.
SIDE_KEYS = ("sample_rate", "fps", "finish_reason", "num_tokens", "num_steps")
_SIDE_RULE = AccumulationRule(_keep_last, drain=False)
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
    """Accumulates a stage's streamed deltas by key.

    ``take()`` returns what a consumer should see now: for drained keys only
    what arrived since the last ``take``; for retained keys (``token_ids``,
    ``latent`` and side keys) the whole value so far. ``total`` is always the
    whole accumulation.
    """

    def __init__(self, rules: dict[str, AccumulationRule] | None = None):
        self._rules = {**DEFAULT_RULES, **(rules or {})}
        self.total: dict[str, Payload] = {}
        self._pending: dict[str, Payload] = {}

    def rule(self, key: str) -> AccumulationRule:
        if key in self._rules:
            return self._rules[key]
        if key in SIDE_KEYS:
            return _SIDE_RULE
        # Unknown auxiliary keys behave like a list of items: append, drained.
        return AccumulationRule(_append, drain=True)

    def add(self, delta: dict[str, Payload]) -> None:
        for key, value in delta.items():
            if value is None:
                continue
            rule = self.rule(key)
            self.total[key] = rule.combine(self.total[key], value) if key in self.total else value
            if rule.drain:
                self._pending[key] = rule.combine(self._pending[key], value) if key in self._pending else value

    def take(self) -> dict[str, Payload]:
        out: dict[str, Payload] = {}
        for key, value in self.total.items():
            if self.rule(key).drain:
                if key in self._pending:
                    out[key] = self._pending[key]
            else:
                out[key] = value
        self._pending.clear()
        return out
