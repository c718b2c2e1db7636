"""What the verbs' parsers share: the type of the sub-command set each verb adds itself to, and
the argument types that check numbers."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TypeVar

SubParsers = Any  # argparse's _SubParsersAction is private
N = TypeVar("N", int, float)


def _parsed(text: str, kind: Callable[[str], N], ok: Callable[[N], bool], need: str) -> N:
    try:
        value = kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"{text!r}: {need}")
    return value


def positive_arg(text: str) -> float:
    return _parsed(text, float, lambda v: v > 0, "must be positive")


def count_arg(text: str) -> int:
    return _parsed(text, int, lambda v: v >= 1, "must be at least 1")


def seconds_arg(text: str) -> float:
    return _parsed(text, float, lambda v: v >= 0, "must be at least 0")
