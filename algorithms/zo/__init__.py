"""Zeroth-order family: seeded perturbations, MeZO, SparQ (ZO2 / DistZO2 to come).

Importing the package registers ``mezo``, ``sparq`` and the ``sparq``
experiment of ``commbench reproduce``.
"""

from . import experiment, mezo, sparq  # noqa: F401

from . import distzo2, distzo2_experiment, zo2  # noqa: F401  # isort: skip  (DistZO2)
