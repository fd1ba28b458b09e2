"""First-order pipeline family: the uncompressed references and the compressed pipelines
(direct compression, AQ-SGD, Clapping-FC / FU) with the ``clapping`` experiment."""

from . import compressed, experiment, sgd  # noqa: F401
