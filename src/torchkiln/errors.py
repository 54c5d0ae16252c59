"""Errors a user can act on.

Every problem torchkiln reports about user input is a :class:`Problem`: the file, the dotted field path,
what is wrong and what would be valid. The CLI prints them one per line and exits 2; nothing that comes
from a recipe ever surfaces as a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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


class ProblemsError(TorchkilnError):
    """Input that cannot be used. Carries every problem found, not just the first (exit status 2)."""

    exit_code = EXIT_USAGE

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class RecipeError(ProblemsError):
    """A recipe that cannot be used."""


class DocumentError(ProblemsError):
    """A lock file or manifest that cannot be read (missing, not JSON, another format, a wrong field)."""


class UsageError(TorchkilnError):
    """Bad command-line input (a flag value, a missing file)."""

    exit_code = EXIT_USAGE


class BuildFailed(TorchkilnError):
    """A step failed: the message carries the first error, the log tail and the log path."""

    def __init__(self, message: str, *, step: str, log: Path | None = None) -> None:
        super().__init__(message)
        self.step = step
        self.log = log


class ConfigureMismatch(BuildFailed):
    """CMake's configuration summary contradicts the recipe: stopped before compiling."""


class Interrupted(TorchkilnError):
    """Ctrl-C or SIGTERM: the running step was stopped, dist/ is unchanged."""

    exit_code = 130
