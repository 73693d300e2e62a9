"""The ``geosharp`` command line.

    geosharp derive [--spec FILE.py] [--out DIR] [--check]
    geosharp demo

``derive`` imports the SymPy engine (derivations, codegen) lazily: the evaluator's run-time commands
never import SymPy.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def _derive(args) -> int:
    from codegen.builtins import generate_builtins
    from codegen.generate import GENERATED_DIR, write_modules
    from codegen.spec import generate_from_spec

    t0 = time.perf_counter()
    if args.spec:
        modules, timings = generate_from_spec(Path(args.spec), progress=_progress)
        out = Path(args.out) if args.out else Path.cwd() / "generated_kernels"
    else:
        modules, timings = generate_builtins(progress=_progress)
        out = Path(args.out) if args.out else GENERATED_DIR
    elapsed = time.perf_counter() - t0
    if args.check:
        stale = [m.name for m in modules if not (out / f"{m.name}.py").exists()
                 or (out / f"{m.name}.py").read_text() != m.source]
        if stale:
            print(f"stale generated modules in {out}: {', '.join(stale)}; run `geosharp derive`")
            return 1
        print(f"{len(modules)} generated modules in {out} are up to date ({elapsed:.1f} s)")
        return 0
    paths = write_modules(modules, out)
    print(f"derived and generated {len(paths)} modules in {elapsed:.1f} s -> {out}")
    return 0


def _progress(name, seconds):
    print(f"  {name:<24s} {seconds:6.2f} s", flush=True)


def _demo(args) -> int:
    from .verify_kernels import verification_table

    print("geosharp demo: derive the built-in quotient geometries, generate their kernels, verify them\n")
    rc = _derive(argparse.Namespace(spec=None, out=None, check=False))
    if rc:
        return rc
    print()
    ok, table = verification_table()
    print(table)
    print("\nall checks passed" if ok else "\nSOME CHECKS FAILED")
    return 0 if ok else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="geosharp", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("derive", help="derive geometries and generate PyTorch kernel modules")
    p.add_argument("--spec", help="a Python file declaring SPEC = {module_name: Metric} (your own symmetry)")
    p.add_argument("--out", help="output directory (default: the package's codegen/generated for built-ins, "
                                 "./generated_kernels for --spec)")
    p.add_argument("--check", action="store_true", help="only check that the files on disk are up to date")
    p.set_defaults(func=_derive)
    p = sub.add_parser("demo", help="derive, generate and verify the built-in geometries")
    p.set_defaults(func=_demo)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except Exception as exc:  # clear one-line errors for declaration problems
        from_engine = type(exc).__module__.startswith(("derivations", "codegen"))
        if from_engine or isinstance(exc, (FileNotFoundError, ValueError)):
            print(f"geosharp: error: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
