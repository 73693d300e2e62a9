"""``geosharp derive``: derive geometries symbolically and generate their kernel modules.

The only command that imports the SymPy engine (``derivations``) and the code generator; it imports them
when it runs, never at start-up.
"""
from __future__ import annotations

import time
from pathlib import Path

__all__ = ["run"]


def run(args) -> int:
    """Derive and generate (or, with ``--check``, compare with the files on disk)."""
    from codegen.builtins import generate_builtins  # the symbolic side: only this command loads it
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
