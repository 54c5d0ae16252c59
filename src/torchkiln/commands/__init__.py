"""The command line: one module per ``torchkiln`` subcommand, each a ``register`` (its arguments) and a
``run`` (turn them into calls of the layers below, and an exit status).

``torchkiln.cli`` builds the parser from these modules; a command holds no logic of its own beyond reading
its arguments: ``plan`` and ``check`` and ``build`` share one argument set (:mod:`.plan`), so what is
planned, checked and built is the same.

May import every package. Nothing below imports a command.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any


class _Renamed(argparse.Action):
    """The old spelling of a renamed option: sets what the new one sets (its constant, for a flag; its value,
    for an option that takes one), and says the new name (once)."""

    def __init__(self, option_strings: Sequence[str], dest: str, new: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, **kwargs)
        self.new, self.said = new, False

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, *_: Any
    ) -> None:
        if not self.said:
            self.said = True
            print(
                f"torchkiln: '{self.option_strings[0]}' is deprecated: it is now '{self.new}'",
                file=sys.stderr,
            )
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def add_renamed(parser: argparse._ActionsContainer, old: str, new: str) -> None:
    """``old``, the former spelling of the option ``new`` (added to ``parser`` before it; issue 48: one meaning
    per name): still accepted, left out of the help, setting what ``new`` sets, a flag or an option with a
    value alike (its destination, arity and constant are read from ``new``'s own action)."""
    action = parser._option_string_actions[new]
    parser.add_argument(
        old,
        dest=action.dest,
        action=_Renamed,
        nargs=action.nargs,
        const=action.const,
        metavar=action.metavar,
        new=new,
        help=argparse.SUPPRESS,
    )
