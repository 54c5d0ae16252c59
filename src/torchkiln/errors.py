"""Errors a user can act on.

Every problem torchkiln reports about user input is a :class:`Problem`: the file, the dotted field path,
what is wrong and what would be valid. The CLI prints them one per line and exits 2; nothing that comes
from a recipe ever surfaces as a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


@dataclass(frozen=True)
class Problem:
    """One thing wrong with one field of one input file."""

    file: str
    field: str
    message: str
    valid: str = ""

    def __str__(self) -> str:
        hint = f" (valid: {self.valid})" if self.valid else ""
        return f"{self.file}: {self.field}: {self.message}{hint}"


class TorchkilnError(Exception):
    """Base class: an error with a message meant for the user, never a traceback."""

    exit_code = EXIT_FAILURE


class RecipeError(TorchkilnError):
    """A recipe that cannot be used. Carries every problem found, not just the first."""

    exit_code = EXIT_USAGE

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class UsageError(TorchkilnError):
    """Bad command-line input (a flag value, a missing file)."""

    exit_code = EXIT_USAGE
