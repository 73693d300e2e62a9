"""The ``geosharp`` command line: one argparse tree (:mod:`.parser`), one module per command.

    geosharp derive [--spec FILE.py] [--out DIR] [--check]
    geosharp demo
    geosharp evaluate MODEL_DIR --data FILE --rho R --metric adaptive|inv|mix [options]
    geosharp verify MODEL_DIR [--data FILE] [--rho 0.05] [--scales 0.01,1,100] [--seed 0]
    geosharp symmetries MODEL_DIR [--json OUT]
    geosharp data MODEL_DIR (--text FILE --text-column C --label-column L | --images DIR) --out FILE
    geosharp diagnet [--models 50] [--seed 0] [--out DIR]
    geosharp population train|evaluate|study|calibrate|import|reliability|status|pack|rebuild|exclude|correlate
        --out DIR [options]

Each command module (:mod:`.derive`, :mod:`.demo`, :mod:`.evaluate`, :mod:`.verify`,
:mod:`.symmetries`, :mod:`.data`, :mod:`.diagnet`, :mod:`.population`) parses nothing and prints its
results; it is imported only when its command runs, so help and argument errors come without importing
torch. Only ``derive`` imports the SymPy engine.

Errors: bad input (a missing file, an invalid value, a declaration the engine refuses, a full disk) prints
one line ``geosharp: error: …`` on stderr and exits with code 2; ``verify`` exits with 1 when a check fails;
Ctrl-C prints one line and exits with 130 (no traceback). A failed run removes the output directories it
created (where they hold no file); every file is written atomically, so none is left half-written.
docs/reference/errors.md lists each refused input with the test that covers it.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import shutil
import sys
import warnings
from pathlib import Path

from ..cpu_allocator import keep_freed_memory, return_freed_memory
from .parser import COMMANDS, build_parser

__all__ = ["main", "one_line", "EXIT_INTERRUPTED"]

#: the exit code after Ctrl-C (128 + SIGINT, as a shell reports it)
EXIT_INTERRUPTED = 130
#: the options that name what a command writes: a file (its parent directories may be created) or a directory
_OUTPUT_FILES = ("json",)
_OUTPUT_DIRS = ("out", "population_out")


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


def parse_command(argv) -> argparse.Namespace:
    """``argv`` parsed as a ``geosharp`` command line (e.g. a stage of ``population pipeline``'s plan); a usage
    error is raised as a one-line ``ValueError``."""
    parser = build_parser()
    _one_line_errors(parser)
    try:
        return parser.parse_args(list(argv))
    except _UsageError as exc:
        raise ValueError(one_line(exc)) from None


def one_line(message) -> str:
    """``message`` on one line: its lines joined (a library's multi-line text must not follow our line)."""
    return " ".join(" ".join(str(message).split("\n")).split())


def _missing_outputs(args) -> list:
    """The topmost directories on the way to each output of ``args`` that do not exist yet (the run may create
    them; a failed run removes them again where they hold no file)."""
    top = []
    outputs = [(getattr(args, k, None), True) for k in _OUTPUT_FILES]
    outputs += [(getattr(args, k, None), args.command == "data") for k in _OUTPUT_DIRS]  # data --out is a file
    for value, is_file in outputs:
        if not isinstance(value, str) or not value:
            continue
        path = Path(value).absolute()
        path = path.parent if is_file else path
        missing = None
        while not path.exists() and path != path.parent:
            missing, path = path, path.parent
        if missing is not None:
            top.append(missing)
    return top


def _remove_created(dirs) -> None:
    """Remove the directories of ``dirs`` a failed run created, where no file was written below them."""
    for d in dirs:
        if d.is_dir() and not any(p.is_file() or p.is_symlink() for p in d.rglob("*")):
            shutil.rmtree(d, ignore_errors=True)


def main(argv=None) -> int:
    """Run ``geosharp`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("geosharp: error: interrupted (Ctrl-C); files are written atomically, so nothing half-written is "
              "kept: rerun the command to start again (population commands resume where they stopped)",
              file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(argv) -> int:
    parser = build_parser()
    parser.add_argument("--version", action="version", version=f"geosharp {version()}")
    _one_line_errors(parser)
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except _UsageError as exc:
        print(f"geosharp: error: {one_line(exc)}", file=sys.stderr)
        return 2
    created = _missing_outputs(args)
    ok = False
    try:
        command = importlib.import_module(f"{__name__}.{COMMANDS[args.command]}")  # lazily: only what runs
        if args.command == "verify":  # float64 on a whole model: memory-bound, return freed memory to the system
            return_freed_memory()
        elif args.command != "derive":  # run-time commands: reuse freed heap memory across iterations
            keep_freed_memory()
        with warnings.catch_warnings():  # the libraries' own deprecation notices are not the user's to act on
            warnings.filterwarnings("ignore", category=FutureWarning)
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            code = command.run(args)
        ok = code == 0
        return code
    except Exception as exc:  # bad input: one clear line, exit code 2
        from_engine = type(exc).__module__.startswith(("derivations", "codegen"))
        if from_engine or isinstance(exc, (ValueError, OSError)):  # OSError: missing files, a full disk, …
            print(f"geosharp: error: {one_line(exc)}", file=sys.stderr)
            return 2
        raise
    finally:
        if not ok:
            _remove_created(created)


if __name__ == "__main__":
    sys.exit(main())
