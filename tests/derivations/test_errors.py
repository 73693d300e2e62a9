"""Bad declarations and metrics are refused with messages that say what is wrong."""
import pytest
from sympy import Inverse, Trace

from derivations import (
    DeclarationError,
    Metric,
    MetricError,
    NotInvariantError,
    Symmetry,
    builtin_metric,
    check_invariance,
    derive_geometry,
    get_symmetry,
    gl_pair,
)


@pytest.fixture(scope="module")
def pair():
    s = gl_pair()
    G, H = s.blocks
    (xG, xH), (eG, eH) = s.tangent("xi"), s.tangent("eta")
    return s, G, H, xG, xH, eG, eH


def test_action_that_does_not_preserve_the_function_is_refused(pair):
    s, G, H, *_ = pair
    A = s.group_element
    with pytest.raises(DeclarationError, match="does not preserve the declared function"):
        Symmetry(name="bad", blocks=s.blocks, group_element=A, identity=s.identity,
                 action=(G * A, H * Inverse(A)), invariant=(G * H.T,))


def test_action_with_wrong_shape_is_refused(pair):
    s, G, H, *_ = pair
    with pytest.raises(DeclarationError, match="shape"):
        Symmetry(name="bad", blocks=s.blocks, group_element=s.group_element, identity=s.identity,
                 action=(G * s.group_element, H.T), invariant=(G * H.T,))


def test_action_that_moves_points_at_the_identity_is_refused(pair):
    s, G, H, *_ = pair
    A = s.group_element
    with pytest.raises(DeclarationError, match="identity"):
        Symmetry(name="bad", blocks=s.blocks, group_element=A, identity=s.identity,
                 action=(2 * G * A, H * Inverse(A).T / 2), invariant=(G * H.T,))


def test_non_invariant_metric_gives_counterexample(pair):
    s, G, H, xG, xH, eG, eH = pair
    euclid = Metric(s, Trace(xG.T * eG) + Trace(xH.T * eH), "euclidean")
    res = check_invariance(euclid)
    assert res.status == "counterexample" and res.witness["value"] != 0
    with pytest.raises(NotInvariantError, match="not invariant"):
        derive_geometry(euclid)


def test_indefinite_metric_is_refused(pair):
    s, G, H, xG, xH, eG, eH = pair
    indefinite = Trace(Inverse(G.T * G) * xG.T * eG) - Trace(Inverse(H.T * H) * xH.T * eH)
    with pytest.raises(MetricError, match="not positive definite"):
        derive_geometry(Metric(s, indefinite, "indefinite"))


def test_non_bilinear_metric_is_refused(pair):
    s, G, H, xG, xH, eG, eH = pair
    cubic = Trace(xG.T * eG) * Trace(xG.T * xG) + Trace(xH.T * eH)
    with pytest.raises(MetricError, match="not bilinear"):
        derive_geometry(Metric(s, cubic, "cubic"))


def test_non_symmetric_metric_is_refused(pair):
    s, G, H, xG, xH, eG, eH = pair
    skew = Trace(xG.T * eG) + Trace(xH.T * eH) + Trace(G.T * xG * H.T * eH)
    with pytest.raises(MetricError, match="not symmetric"):
        derive_geometry(Metric(s, skew, "skew"))


def test_unknown_names_list_the_known_ones():
    with pytest.raises(DeclarationError, match="gl_pair"):
        get_symmetry("gl_triple")
    with pytest.raises(MetricError, match="inv"):
        builtin_metric(get_symmetry("gl_pair"), "fisher")
