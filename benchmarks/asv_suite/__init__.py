"""The asv suite (``asv.conf.json``'s ``benchmark_dir``): bytes, messages, memory and seconds
per step of every family, tracked across commits.  Not named ``asv``: asv puts this folder's
parent first on ``sys.path``, and a folder of that name would shadow the asv package."""
