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

from .claims import Claim, claim, claims_table
from .registry import (
    EXPERIMENTS,
    MODULES,
    ORDER,
    SUPPORTING,
    Experiment,
    all_experiments,
    experiment,
    get_experiment,
)
from .runner import (
    ALL_BUDGET_S,
    check_paper_tables,
    has_paper_column,
    run_and_save,
    run_experiments,
)

__all__ = [
    "ALL_BUDGET_S", "EXPERIMENTS", "MODULES", "ORDER", "SUPPORTING", "Claim", "Experiment", "all_experiments",
    "check_paper_tables", "claim", "claims_table", "experiment", "get_experiment", "has_paper_column",
    "run_and_save", "run_experiments",
]
