"""``geosharp derive``: derive geometries symbolically and generate their kernel modules.

The only module that imports the SymPy engine (``derivations``) and the code generator; it imports them
when it runs, never at start-up. :func:`spec_kernels` derives one metric of a spec file in memory for
``evaluate``/``verify``/``symmetries --spec`` (the evaluator itself then needs only the generated module).
"""
from __future__ import annotations

import time
from pathlib import Path

from ..kernels import load_kernels, module_from_source

__all__ = ["run", "spec_kernels", "GENERATED_HEADER"]

#: the first line of every generated kernel module
GENERATED_HEADER = "# GENERATED FILE - DO NOT EDIT."


def spec_kernels(path, name=None):
    """The kernel module of metric ``name`` of spec file ``path``, derived and generated in memory (nothing is
    written); ``path`` may also be a module ``geosharp derive`` wrote (then ``name`` must be None or its
    name). ``name`` None: the spec's only metric."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"spec file {str(path)!r} does not exist")
    with open(path, encoding="utf-8", errors="replace") as f:
        first = f.readline().strip()
    if first == GENERATED_HEADER:
        module = load_kernels(path)
        if name is not None and name != path.stem:
            raise ValueError(f"{path} is the generated module {path.stem!r}, not {name!r}")
        return module
    from codegen.spec import generate_from_spec, load_spec  # the symbolic side, only when a spec is derived

    if name is None:
        names = list(load_spec(path))
        if len(names) != 1:
            raise ValueError(f"{path} declares {len(names)} metrics ({', '.join(names)}); pick one with --metric NAME")
        name = names[0]
    (generated,), _ = generate_from_spec(path, names=[name])
    return module_from_source(name, generated.source)


def run(args) -> int:
    """Derive and generate (or, with ``--check``, compare with the files on disk)."""
    from codegen.builtins import generate_builtins  # the symbolic side: only this command loads it
    from codegen.generate import GENERATED_DIR, write_modules
    from codegen.spec import generate_from_spec

    t0 = time.perf_counter()
    choice = getattr(args, "metric", None)
    if args.spec and _symmetry_only(args.spec):  # a symmetry without a metric: list / derive invariant metrics
        from codegen.symmetry_spec import families, generate_invariant, listing

        if choice is None:
            print(listing(args.spec, families(args.spec)))
            return 0
        modules, timings = generate_invariant(Path(args.spec), choice, progress=_progress)
        out = Path(args.out) if args.out else Path.cwd() / "generated_kernels"
    elif choice is not None:
        raise ValueError("--metric picks an invariant metric of a spec that declares SYMMETRY and no SPEC; "
                         "drop --metric (a SPEC file derives all its metrics)")
    elif args.spec:
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


def _symmetry_only(path) -> bool:
    from codegen.symmetry_spec import declares_symmetry_only

    return declares_symmetry_only(path)


def _progress(name, seconds):
    print(f"  {name:<24s} {seconds:6.2f} s", flush=True)
