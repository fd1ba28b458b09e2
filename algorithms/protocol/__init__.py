"""Protocol Models (subspace-constrained pipeline): ``protocol``, ``protocol-central`` and the
``protocol`` experiment behind ``commbench reproduce protocol``."""

from . import experiment, pipeline  # noqa: F401
