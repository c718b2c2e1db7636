"""The scenario protocol: what one benchmark gives the one entry point (``bench.cli``) and
the suite (``bench.suite``) -- its name and texts, its options as command-line arguments and
as the suite's full or ``--quick`` defaults, how it runs, its report and its check.

A scenario's result is a dataclass: the entry point prints ``report(result)``, writes the
result as JSON (``bench.report.write_json``) and fails the run with ``check(result)`` when
that says why.
"""

from __future__ import annotations

import abc
import argparse
import sys
from collections.abc import Iterable
from typing import ClassVar, Generic, TypeVar

OptionsT = TypeVar("OptionsT")
ResultT = TypeVar("ResultT")


class Scenario(abc.ABC, Generic[OptionsT, ResultT]):
    """One benchmark (or measuring tool) and everything the entry point needs to run it.

    A scenario names itself in its class statement (``class LabScenario(Scenario[...],
    name="lab", alias="bench.lab")``); its class docstring is its title (the first line) and
    its description in BENCHMARKS.md (the rest); its module's docstring is its --help."""

    name: ClassVar[str]  # ``python -m bench <name>``; ``bench-results/<name>.json``
    alias: ClassVar[str]  # the module it also runs as (``python -m bench.router``)
    in_suite: ClassVar[bool]  # run by ``python -m bench``; a tool is not

    def __init_subclass__(cls, *, name: str, alias: str, in_suite: bool = True,
                          **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.name, cls.alias, cls.in_suite = name, alias, in_suite

    @property
    def title(self) -> str:
        """Its section's heading in BENCHMARKS.md, its line in --help."""
        return (type(self).__doc__ or "").strip().partition("\n")[0]

    @property
    def about(self) -> str:
        """Its section's text in BENCHMARKS.md: the docstring after the title, one line."""
        return " ".join((type(self).__doc__ or "").strip().partition("\n")[2].split())

    @property
    def doc(self) -> str:
        """Its --help: its module's docstring (the first paragraph, then the rest)."""
        return sys.modules[type(self).__module__].__doc__ or ""

    @abc.abstractmethod
    def add_options(self, ap: argparse.ArgumentParser) -> None:
        """Its command-line arguments."""

    @abc.abstractmethod
    def options(self, args: argparse.Namespace) -> OptionsT:
        """Its options from the parsed arguments (``args.json`` included)."""

    @abc.abstractmethod
    def defaults(self, quick: bool) -> OptionsT:
        """Its options in the suite: the full size, or the smoke-test size."""

    @abc.abstractmethod
    def run(self, options: OptionsT) -> ResultT:
        """Measure; every process started is stopped on return, error and Ctrl-C."""

    @abc.abstractmethod
    def report(self, result: ResultT) -> str:
        """The result as text (BENCHMARKS.md's section)."""

    def check(self, result: ResultT) -> str | None:
        """Why the result is a failure (never a figure's value), or None."""
        return None

    def run_from(self, args: argparse.Namespace) -> ResultT | None:
        """A run from the command line; None where the run handed its result on itself (as
        JSON to the process that started it) and nothing is left to print."""
        return self.run(self.options(args))


def take_given(options: object, args: argparse.Namespace, names: Iterable[str]) -> None:
    """Each of ``names`` given on the command line (not None) replaces the option's default
    (a default that depends on ``--quick``)."""
    for name in names:
        if getattr(args, name) is not None:
            setattr(options, name, getattr(args, name))
