"""The convex problems and the data they read, declared without torch: what ``commbench
list`` shows and the algorithms' declarations (:mod:`.params`) name; :mod:`.problems` builds them.
"""

from __future__ import annotations

from harness.datasets import DataDecl, declare_data

PROBLEMS = ("logreg-cancer", "logreg-digits", "mlp-digits")
#: the harness dataset each problem (the run's model) trains on
PROBLEM_DATA = {"logreg-cancer": "sklearn-breast-cancer", "logreg-digits": "sklearn-digits",
                "mlp-digits": "sklearn-digits"}

# Real tables shipped inside the scikit-learn wheel.
declare_data(DataDecl("sklearn-breast-cancer", "algorithms.dataparallel.problems:BreastCancerData", "real",
                      "scikit-learn {version} (load_breast_cancer, bundled)", package="scikit-learn",
                      modality="table"))
declare_data(DataDecl("sklearn-digits", "algorithms.dataparallel.problems:DigitsData", "real",
                      "scikit-learn {version} (load_digits, bundled)", package="scikit-learn",
                      modality="table"))
