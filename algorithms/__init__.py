"""Algorithms by family.  Importing this package registers every algorithm."""

from . import pipeline  # noqa: F401  (registers fo-sgd, pipeline-sgd)
