"""Verification: independent references and the checks that compare against them.

* :mod:`~geosharp_ref.verification.reference` — metric-only torch.func Christoffel contraction (Koszul
  formula) and scipy geodesic integration
* :mod:`~geosharp_ref.verification.kernel_checks` — generated kernels against the references (ladder rungs 3–5)
* :mod:`~geosharp_ref.verification.orbits` — orbit invariance of a whole model
"""
