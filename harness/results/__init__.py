"""Result records of runs, split by concern.

* :mod:`.schema`: the record (``commbench.result/1``), its metrics and validation;
* :mod:`.files`: atomic writes and validating reads of result files;
* :mod:`.fingerprint`: ``params_sha256``, the hash that runs meant to agree must share;
* :mod:`.environment`: ``env_info``, where and with what a run happened;
* :mod:`.claims_file`: ``claims.json`` (``commbench.claims/1``), its row schema and ``read_claims``;
* :mod:`.from_ranks`: ``build_record``, one record from the ranks' outputs (import it
  from there: it needs torch and the run context, which the others do not).
"""

from .claims_file import CLAIMS_SCHEMA, ClaimRow, ClaimsError, ClaimsFile, read_claims
from .environment import env_info
from .files import (
    OutputChanged,
    OutputRefused,
    atomic_write,
    file_stamp,
    read_result,
    read_results,
    regular_target,
    write_result,
)
from .fingerprint import params_sha256, params_sha256_of_model
from .schema import (
    DATA_KINDS,
    REQUIRED_METRICS,
    SCHEMA,
    THROUGHPUT_METRICS,
    Metric,
    ResultError,
    ResultRecord,
)

__all__ = [
    "CLAIMS_SCHEMA", "DATA_KINDS", "REQUIRED_METRICS", "SCHEMA", "THROUGHPUT_METRICS", "ClaimRow",
    "ClaimsError", "ClaimsFile", "Metric", "OutputChanged", "OutputRefused", "ResultError",
    "ResultRecord", "atomic_write", "env_info", "file_stamp", "params_sha256",
    "params_sha256_of_model", "read_claims", "read_result", "read_results", "regular_target",
    "write_result",
]
