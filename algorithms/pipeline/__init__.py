"""First-order pipeline family: the uncompressed references and (later) compressed pipelines."""

from . import sgd  # noqa: F401
