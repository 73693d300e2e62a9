"""Experiments built on the evaluator core.

* :mod:`~geosharp_ref.studies.toy` — the scalar toy model f = g·h·x (paper Figures 1 and 6)
* :mod:`~geosharp_ref.studies.diagnet` — diagonal linear networks (paper Figure 3)
* :mod:`~geosharp_ref.studies.population` — populations of transformers and the sharpness-vs-gap study
"""
