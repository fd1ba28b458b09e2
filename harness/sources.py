"""A data set's source line with the installed version of the package it ships in.

Torch-free and importing nothing of the project: ``harness.data`` (the data
sets) and ``commbench list data`` (which reads the declarations without torch)
both render sources with it, so the two cannot disagree.
"""

from __future__ import annotations


def versioned_source(pattern: str, package: str | None) -> str:
    """``pattern`` with ``{version}`` replaced by the installed version of ``package`` (a
    declaration holds the pattern, so it does not depend on what is installed where it was written)."""
    if package is None:
        return pattern
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version(package)
    except PackageNotFoundError:
        installed = "unknown"
    return pattern.format(version=installed)
