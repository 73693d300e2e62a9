"""geosharp reference evaluator: geometries from the generated kernels, model symmetry maps,
adaptive and geodesic sharpness (Auto-PGD), verification. Never imports SymPy at run time."""
from .symmetry_map import PairSpec, SymmetryMap, symmetry_map

__all__ = ["PairSpec", "SymmetryMap", "symmetry_map"]
