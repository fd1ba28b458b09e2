"""First-order pipeline family: the uncompressed references (``fo-sgd``, ``pipeline-sgd``) and the
compressed pipelines (direct compression, AQ-SGD, Clapping-FC / FU)."""
