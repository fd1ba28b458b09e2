"""Algorithms by family.  Importing this package registers every algorithm
(and every experiment behind ``commbench reproduce``)."""

from . import dataparallel, pipeline, protocol, zo  # noqa: F401
