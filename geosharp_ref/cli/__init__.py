"""The ``geosharp`` command line: one argparse tree (:mod:`.parser`), one module per command.

    geosharp derive [--spec FILE.py] [--out DIR] [--check]
    geosharp demo
    geosharp evaluate MODEL_DIR --data FILE --rho R --metric adaptive|inv|mix [options]
    geosharp verify MODEL_DIR [--data FILE] [--rho 0.05] [--scales 0.01,1,100] [--seed 0]
    geosharp symmetries MODEL_DIR [--json OUT]
    geosharp data MODEL_DIR (--text FILE --text-column C --label-column L | --images DIR) --out FILE
    geosharp diagnet [--models 50] [--seed 0] [--out DIR]
    geosharp population train|evaluate|study|calibrate|import|correlate --out DIR [options]

Each command module (:mod:`.derive`, :mod:`.demo`, :mod:`.evaluate`, :mod:`.verify`,
:mod:`.symmetries`, :mod:`.data`, :mod:`.diagnet`, :mod:`.population`) parses nothing and prints its
results; it is imported only when its command runs, so help and argument errors come without importing
torch. Only ``derive`` imports the SymPy engine.

Errors: bad input (a missing file, an invalid value, a declaration the engine refuses, a full disk) prints
one line ``geosharp: error: …`` on stderr and exits with code 2; ``verify`` exits with 1 when a check fails.
The README's bad-input table lists each case; ``tests/geosharp_ref/cli/test_bad_input.py`` tests each row.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys

from ..cpu_allocator import keep_freed_memory
from .parser import COMMANDS, build_parser

__all__ = ["main"]


def version() -> str:
    """The installed package's version (``geosharp --version``)."""
    try:
        return importlib.metadata.version("geosharp")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree that is not installed
        return "unknown (not installed)"


class _UsageError(Exception):
    """A command-line usage error (argparse's), reported in the one-line error format."""


def _one_line_errors(parser: argparse.ArgumentParser) -> None:
    """Make ``parser`` and all its sub-parsers raise :class:`_UsageError` instead of printing usage and
    exiting, so that a bad option reads like every other error: ``geosharp: error: …`` and exit code 2."""
    def error(message, _prog=parser.prog):
        raise _UsageError(f"{_prog}: {message} (see `{_prog} --help`)")

    parser.error = error
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _one_line_errors(sub)


def main(argv=None) -> int:
    """Run ``geosharp`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    parser = build_parser()
    parser.add_argument("--version", action="version", version=f"geosharp {version()}")
    _one_line_errors(parser)
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except _UsageError as exc:
        print(f"geosharp: error: {exc}", file=sys.stderr)
        return 2
    command = importlib.import_module(f"{__name__}.{COMMANDS[args.command]}")  # lazily: only what runs
    if args.command != "derive":  # run-time commands: reuse freed heap memory across iterations
        keep_freed_memory()
    try:
        return command.run(args)
    except Exception as exc:  # bad input: one clear line, exit code 2
        from_engine = type(exc).__module__.startswith(("derivations", "codegen"))
        if from_engine or isinstance(exc, (ValueError, OSError)):  # OSError: missing files, a full disk, …
            print(f"geosharp: error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
