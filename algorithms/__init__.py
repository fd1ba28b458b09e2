"""Algorithms by family: ``codecs/``, ``pipeline/``, ``zo/``, ``protocol/``, ``dataparallel/``.

Nothing is imported here: the harness finds algorithms by name through the
families' torch-free declarations (``<family>/params.py``, named in
``harness.registry.FAMILY_MODULES``), lazily (see ARCHITECTURE.md).
"""
