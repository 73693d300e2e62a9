"""The ``geosharp`` command line: one argparse tree (:mod:`.parser`), one module per command.

    geosharp derive [--spec FILE.py] [--out DIR] [--check]
    geosharp demo
    geosharp evaluate MODEL_DIR --data FILE --rho R --metric adaptive|inv|mix [options]
    geosharp verify MODEL_DIR [--data FILE] [--rho 0.05] [--scales 0.01,1,100] [--seed 0]
    geosharp diagnet [--models 50] [--seed 0] [--out DIR]
    geosharp population train|evaluate|study|import|correlate --out DIR [options]

Each command module (:mod:`.derive`, :mod:`.demo`, :mod:`.evaluate`, :mod:`.verify`, :mod:`.diagnet`,
:mod:`.population`) parses nothing and prints its results; it is imported only when its command runs, so
help and argument errors come without importing torch. Only ``derive`` imports the SymPy engine.

Errors: bad input (a missing file, an invalid value, a declaration the engine refuses) prints one line
``geosharp: error: …`` on stderr and exits with code 2; ``verify`` exits with 1 when a check fails.
"""
from __future__ import annotations

import importlib
import sys

from ..cpu_allocator import keep_freed_memory
from .parser import COMMANDS, build_parser

__all__ = ["main"]


def main(argv=None) -> int:
    """Run ``geosharp`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    command = importlib.import_module(f"{__name__}.{COMMANDS[args.command]}")  # lazily: only what runs
    if args.command != "derive":  # run-time commands: reuse freed heap memory across iterations
        keep_freed_memory()
    try:
        return command.run(args)
    except Exception as exc:  # bad input: one clear line, exit code 2
        from_engine = type(exc).__module__.startswith(("derivations", "codegen"))
        if from_engine or isinstance(exc, (FileNotFoundError, ValueError)):
            print(f"geosharp: error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
