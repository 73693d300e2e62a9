"""Errors raised by the derivation engine. Each message says what is wrong and what to do."""


class DerivationError(ValueError):
    """Base class: a declaration or metric the engine cannot accept."""


class DeclarationError(DerivationError):
    """The symmetry declaration is inconsistent (shapes, identity, invariant not preserved)."""


class MetricError(DerivationError):
    """The metric is malformed: not bilinear, not symmetric, or not positive definite."""


class NotInvariantError(DerivationError):
    """The metric is not invariant under the declared group action."""


class UnsupportedStructureError(DerivationError):
    """The derivation needs a structure the engine does not solve in closed form."""
