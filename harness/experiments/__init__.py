"""Experiments behind ``commbench reproduce NAME|all`` — the only package that
knows both the harness and the algorithms (see ARCHITECTURE.md).

An experiment is a named list of runs plus the tables that compare them, one
module each (``registry.MODULES``).  Each writes its result records under
``<out_dir>/<name>/runs/`` and its tables as markdown, CSV and HTML under
``<out_dir>/``.  ``all`` runs every *paper* experiment in ``registry.ORDER``,
prints each table and ends with the claims table; every table of a paper
experiment must hold a column of the paper's numbers beside ours (checked when
it is built).  Supporting experiments (the harness reference, scaling, codec
sizes) run by name.
"""

from harness.lazy import exports

# Names re-exported from the submodules, imported on first use: ``commbench list`` reads
# ``registry`` (torch-free) without loading the claims and runner (which import torch).
_EXPORTS = {
    "Claim": "claims", "claim": "claims", "claims_table": "claims",
    "EXPERIMENTS": "registry", "MODULES": "registry", "ORDER": "registry", "SUPPORTING": "registry",
    "Experiment": "registry", "all_experiments": "registry", "experiment": "registry",
    "get_experiment": "registry",
    "ALL_BUDGET_S": "runner", "check_paper_tables": "runner", "has_paper_column": "runner",
    "run_and_save": "runner", "run_experiments": "runner",
}
__all__ = sorted(_EXPORTS)

__getattr__ = exports(__name__, _EXPORTS)
