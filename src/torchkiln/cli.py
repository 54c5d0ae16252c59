"""Command-line entry point: ``torchkiln <command> ...`` and ``python -m torchkiln``.

Each command lives in its own module under :mod:`torchkiln.commands` with two functions,
``register(subparsers)`` and ``run(args) -> int``. Modules are imported lazily, only for the command that
runs, so a problem in one area (or a heavy import) never breaks the others.

:func:`main` is the one error boundary: a :class:`~torchkiln.errors.TorchkilnError` prints its message, an
``OSError`` (a full disk, a read-only dist/, a file where a directory belongs) prints
``path: what failed (ERRNO); what to do`` (:func:`torchkiln.errors.describe_os_error`); neither a traceback.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

from . import __version__
from .errors import EXIT_FAILURE, EXIT_USAGE, TorchkilnError, describe_os_error

# command name -> (module under torchkiln.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "recipe": ("recipe", "check and list build recipes"),
    "check": ("check", "check a recipe and this host before a build: every problem at once"),
    "plan": ("plan", "print the resolved build plan of a recipe without running anything"),
    "build": ("build", "fetch pinned sources and build torch and torchvision wheels into dist/"),
    "verify": ("verify", "run the verification suite against the importable torch"),
    "reproduce": (
        "reproduce",
        "rebuild the wheels a manifest or provenance records and compare their sha256",
    ),
    "images": ("images", "build the devel and runtime container images of a recipe"),
    "cache": ("cache", "inspect and configure the compiler cache"),
    "cluster": ("cluster", "run and check an sccache-dist build cluster (distributed compiles)"),
}
# Old spellings of renamed commands (issue 48: "dist" also meant the output directory and the published
# wheels): they still run, saying their new name.
RENAMED: dict[str, str] = {"dist": "cluster"}


def _command_module(name: str) -> ModuleType:
    module, _ = COMMANDS[name]
    # A command's modules make hundreds of classes (dataclasses) and nothing to free: the cyclic collector,
    # set off again and again while they are made, scans them for nothing. Off while importing, and what
    # was made is then kept out of its later scans (gc.freeze): a tenth of a no-op build's start (issue 38).
    gc.disable()
    try:
        return importlib.import_module(f"torchkiln.commands.{module}")
    finally:
        gc.freeze()
        gc.enable()


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="torchkiln",
        description="Build PyTorch and torchvision from pinned sources and verify the result.",
    )
    parser.add_argument("--version", action="version", version=f"torchkiln {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name, allow_abbrev=False, help=help_text, add_help=False)
            continue
        _command_module(name).register(
            sub.add_parser(name, allow_abbrev=False, help=help_text, description=help_text)
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    if command in RENAMED:
        new_name = RENAMED[command]
        print(f"torchkiln: '{command}' is deprecated: it is now 'torchkiln {new_name}'", file=sys.stderr)
        argv[argv.index(command)] = command = new_name
    only = command if command in COMMANDS else None
    if only is None and command is not None:
        print(f"torchkiln: unknown command {command!r} (valid: {', '.join(COMMANDS)})", file=sys.stderr)
        return EXIT_USAGE
    # Without a command we only print help: do not import every command module for that.
    parser = build_parser(only=only or "__none__")
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(_command_module(args.command).run(args) or 0)
    except TorchkilnError as exc:
        print(str(exc), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("torchkiln: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        # The one boundary for the filesystem: a full disk, a read-only or missing directory, a file where
        # a directory belongs. One line naming the path, the errno and what to do; never a traceback.
        print(f"torchkiln: {describe_os_error(exc)}", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
