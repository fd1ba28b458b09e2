"""The GPU check: commbench's CUDA paths on one real GPU, in one prepared run.

``bash scripts/gpu-check.sh`` (= ``python -m benchmarks.gpu_check run``) runs, each part in its
own process with its own time cap, continuing past a part that fails or runs out of time:

* ``checks`` — every check marked ``gpu`` (they skip without CUDA), by pytest; pass/fail per check;
* ``zo2`` — ZO2's upload / compute / offload streams at the OPT-125M shape: a per-block
  CUDA-event timeline of one step (how much of the copies the compute hides) and ZO2's step
  time against MeZO's with the whole model resident, interleaved repeats with their spread;
* ``memory-opt-125m``, ``memory-opt-1.3b`` — peak ``torch.cuda.max_memory_allocated`` of
  FO-SGD, MeZO, SparQ (2 stages, both on the one GPU: threads backend) and AQ-SGD (2 stages)
  at batch 32, beside SparQ Table 2's GB (SST-2 rows) and App. B.2's "> 3x" (FO vs ZO);
* ``cpu-meter`` — the same four runs at a smaller sequence on the GPU and on the CPU with the
  tensor-bytes meter (``memory="tensor"``), so the CPU proxy is calibrated against the GPU.

Records (``<part>.json``, the environment in ``summary.json``) and ``summary.md`` go to
``$OUT`` (default: a new temporary directory).  Without CUDA every part is skipped with one
line saying why, the summary is still written, and the exit status is 0.

``python -m benchmarks.gpu_check table DIR`` turns a directory of records (``results/gpu/``)
into the Markdown table for the README.  A directory whose summary says ``"fixture": true``
is labelled as a fixture in every table made from it: it was never measured.

nccl with several ranks needs several GPUs; on one GPU the 2-stage runs use the threads
backend with both ranks on that GPU (their peak is the two stages together).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

SCHEMA = "commbench.gpu-check/1"
ROOT = Path(__file__).resolve().parents[1]
# name -> time cap in seconds (the whole run stays under about 7 minutes at these caps)
PARTS: dict[str, int] = {
    "checks": 100,
    "zo2": 75,
    "memory-opt-125m": 75,
    "memory-opt-1.3b": 150,
    "cpu-meter": 60,
}
BATCH = 32  # SparQ's batch (Table 2)
SEQ = {"opt-125m": 128, "opt-1.3b": 128}  # tokens per sample in the memory runs
CAL_SEQ = 32  # the calibration runs' sequence (the CPU meter runs them on the CPU too)
# (algorithm, world size, params): MeZO's and SparQ's own in-place perturbation (no stash)
MEMORY_RUNS = [
    ("fo-sgd", 1, {}),
    ("mezo", 1, {"mode": "inplace"}),
    ("sparq", 2, {"mode": "inplace"}),
    ("aq-sgd", 2, {}),
]
PAPER_METHOD = {"fo-sgd": "FO-SGD", "mezo": "ZO-SGD", "sparq": "SparQ-4Q-forward", "aq-sgd": "AQ-SGD"}
PAPER_ROW = {"opt-125m": "OPT-125M/SST-2", "opt-1.3b": "OPT-1.3B/SST-2"}
FO_ZO_CLAIM = 3.0  # SparQ App. B.2: FO memory "over 3x" that of memory-efficient ZO methods
GB = 1e9


# --------------------------------------------------------------------------- helpers
def cuda_reason() -> str | None:
    """Why the CUDA parts cannot run here (None when they can)."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return f"torch does not import ({type(e).__name__}: {e})"
    if not torch.cuda.is_available():
        return f"no CUDA device (torch {torch.__version__}, torch.cuda.is_available() is False)"
    return None


def environment() -> dict:
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda_runtime": torch.version.cuda, "platform": platform.platform(),
           "cpu_count": os.cpu_count(), "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        env["git_sha"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                        text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        env["git_sha"] = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(device=torch.cuda.get_device_name(0), device_count=torch.cuda.device_count(),
                   device_memory_bytes=int(props.total_memory),
                   capability=".".join(map(str, torch.cuda.get_device_capability(0))),
                   cudnn=torch.backends.cudnn.version(),
                   tf32_matmul=bool(torch.backends.cuda.matmul.allow_tf32))
        env["driver"] = None
        if shutil.which("nvidia-smi"):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                   capture_output=True, text=True, timeout=20)
                env["driver"] = q.stdout.strip().splitlines()[0] if q.stdout.strip() else None
    else:
        env["device"] = "cpu"
    return env


def write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str) + "\n")
    tmp.replace(path)


def run_on(cfg, device):
    """Run ``cfg`` with its ranks as threads of this process, computing on ``device``
    (``commbench run``'s threads path, with the Comm's device set): the result record."""
    import torch

    from harness.comm import run_threads
    from harness.launcher import rank_program, validate
    from harness.results.from_ranks import build_record

    validate(cfg)
    outputs = run_threads(cfg.world_size, lambda comm: rank_program(cfg, comm), timeout_s=cfg.timeout_s,
                          metered=cfg.metered, max_frame_bytes=cfg.max_frame_bytes, device=device)
    return build_record(cfg, outputs, torch.device(device).type)


def metric(rec, name):
    m = rec.metrics.get(name)
    return None if m is None else m.value


def _free_cuda() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def _sync(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _alloc(dev) -> int:
    import torch

    return int(torch.cuda.memory_allocated(dev)) if dev.type == "cuda" else 0


def _reset_peak(dev) -> None:
    import torch

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)


def _max_alloc(dev) -> int:
    import torch

    return int(torch.cuda.max_memory_allocated(dev)) if dev.type == "cuda" else 0


def memory_config(algo: str, world: int, params: dict, model: str, seq: int, steps: int = 2):
    from harness.registry import make_config

    return make_config(algo, model=model, world_size=world, backend="threads", steps=steps,
                       batch_size=BATCH, seq_len=seq, micro_batches=1, seed=0, timeout_s=300.0,
                       params=dict(params))


# --------------------------------------------------------------------------- parts
def part_checks(out: Path, result: dict) -> None:
    """pytest on every check file with a ``gpu`` mark; one outcome per check."""
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "checks").glob("test_*.py")
                   if "mark.gpu" in p.read_text())
    result["files"] = files
    junit = out / "checks-junit.xml"
    cmd = [sys.executable, "-m", "pytest", *files, "-m", "gpu", "-q", "-rA", f"--junitxml={junit}"]
    if importlib.util.find_spec("pytest_benchmark") is None:  # the project's addopts name its flag
        cmd += ["-o", "addopts=", "-p", "no:cacheprovider"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    (out / "checks-pytest.log").write_text(proc.stdout + proc.stderr)
    result["pytest_exit"] = proc.returncode
    tests = []
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            outcome, msg = "passed", ""
            for tag in ("failure", "error", "skipped"):
                el = case.find(tag)
                if el is not None:
                    outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                    msg = (el.get("message") or "")[:300]
            tests.append({"id": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                          "seconds": float(case.get("time") or 0), "message": msg})
    result["tests"] = tests
    counts = {k: sum(t["outcome"] == k for t in tests) for k in ("passed", "failed", "error", "skipped")}
    result["counts"] = counts
    if proc.returncode not in (0, 5) or counts["failed"] or counts["error"]:
        result["status"] = "failed"
        result["reason"] = f"{counts['failed']} failed, {counts['error']} errors (pytest exit {proc.returncode})"


def overlap_stats(timeline: list[dict]) -> dict:
    """How much of the upload and offload time runs while a block computes (one pass)."""
    comp = sorted((e["start_ms"], e["end_ms"]) for e in timeline if e["op"] == "C")

    def covered(a: float, b: float) -> float:
        return sum(max(0.0, min(b, y) - max(a, x)) for x, y in comp)

    out = {}
    for op, name in (("U", "upload"), ("O", "offload"), ("C", "compute")):
        iv = [(e["start_ms"], e["end_ms"]) for e in timeline if e["op"] == op]
        total = sum(b - a for a, b in iv)
        out[f"{name}_ms"] = total
        if op != "C":
            out[f"{name}_overlapped_fraction"] = (sum(covered(a, b) for a, b in iv) / total) if total > 0 else None
    out["span_ms"] = (max(e["end_ms"] for e in timeline) - min(e["start_ms"] for e in timeline)) if timeline else 0.0
    return out


def part_zo2(out: Path, result: dict, *, model_name: str = "opt-125m", seq: int = 128, rounds: int = 15,
             device: str = "cuda") -> None:
    """ZO2's timeline and its step time against resident MeZO, interleaved (``device`` cpu
    and a tiny model: the checks' quick run of this code)."""
    import torch

    from algorithms.zo.estimator import evaluations, scalars, walk
    from algorithms.zo.perturb import Perturber, step_seeds, zo_update
    from algorithms.zo.zo2 import ZO2Engine, ZO2Params
    from harness.data import get_dataset
    from harness.models import build_model, lm_loss
    from harness.stats import median_iqr, ratio_of_medians

    dev = torch.device(device)
    p = ZO2Params(difference="central", mode="inplace", budget=3)
    n_eval = len(evaluations(p.difference, p.perturbations))
    result["config"] = {"model": model_name, "batch_size": BATCH, "seq_len": seq, "dtype": "float32",
                        "difference": p.difference, "mode": p.mode, "budget": p.budget, "rounds": rounds}
    eng = ZO2Engine(build_model(model_name, seed=0).eval(), device=dev, mode=p.mode, budget=p.budget)
    zo2_resident = _alloc(dev)
    mz = build_model(model_name, seed=0, device=dev).eval()
    pert = Perturber(list(enumerate(mz.parameters())), p.mode)
    result["zo2_resident_bytes"] = zo2_resident
    result["mezo_resident_bytes"] = sum(q.numel() * q.element_size() for q in mz.parameters())
    data = get_dataset("synthetic-markov")
    batches = [tuple(x.to(dev) for x in data.batch(t, batch_size=BATCH, seq_len=seq, seed=0)) for t in range(4)]
    state = {"zo2": 0, "mezo": 0}

    @torch.no_grad()
    def zo2_step():
        t = state["zo2"]
        state["zo2"] += 1
        ids, labels = batches[t % len(batches)]
        seeds = step_seeds(0, t, p.perturbations)
        o = eng.losses(ids, labels, seeds, p)
        eng.defer(seeds, scalars([o[k] for k in range(n_eval)], p.difference, p.mu), p.lr)

    @torch.no_grad()
    def mezo_step():
        t = state["mezo"]
        state["mezo"] += 1
        ids, labels = batches[t % len(batches)]
        seeds = step_seeds(0, t, p.perturbations)
        losses = [lm_loss(mz(ids).logits, labels) for _ in walk(pert, seeds, p.mu, p.difference)]
        zo_update(pert, seeds, scalars(losses, p.difference, p.mu), p.lr)

    def timed(fn) -> float:
        _sync(dev)
        t0 = time.perf_counter()
        fn()
        _sync(dev)
        return time.perf_counter() - t0

    for _ in range(2):  # warm-up: allocator, cuBLAS handles, kernels
        timed(zo2_step)
        timed(mezo_step)
    # memory: each step's peak above what is live (both models) before it
    for name, fn in (("zo2", zo2_step), ("mezo", mezo_step)):
        _sync(dev)
        live = _alloc(dev)
        _reset_peak(dev)
        fn()
        _sync(dev)
        result[f"{name}_step_peak_increment_bytes"] = _max_alloc(dev) - live
    result["zo2_peak_bytes"] = result["zo2_resident_bytes"] + result["zo2_step_peak_increment_bytes"]
    result["mezo_peak_bytes"] = result["mezo_resident_bytes"] + result["mezo_step_peak_increment_bytes"]
    # one traced step: the per-block timeline
    eng.off.trace = []
    timed(zo2_step)
    tl = eng.off.timeline()
    eng.off.trace = None
    result["timeline"] = tl
    result["overlap"] = overlap_stats(tl)
    from algorithms.zo.offload import verify_schedule

    result["schedule_problems"] = verify_schedule(eng.log, len(eng.layers), p.budget)[:10]
    # interleaved repeats, the order alternating each round
    zt, mt = [], []
    for r in range(rounds):
        pair = [(zt, zo2_step), (mt, mezo_step)]
        for acc, fn in (pair if r % 2 == 0 else pair[::-1]):
            acc.append(timed(fn))
    result["zo2_step_s"], result["mezo_step_s"] = zt, mt
    zi, mi = median_iqr(zt), median_iqr(mt)
    result["zo2_step_median_iqr_s"] = [zi.value, zi.lo, zi.hi]
    result["mezo_step_median_iqr_s"] = [mi.value, mi.lo, mi.hi]
    ratio = ratio_of_medians([mt], [zt])  # MeZO time / ZO2 time: ZO2's throughput relative to MeZO
    result["zo2_throughput_vs_mezo"] = [ratio.value, ratio.lo, ratio.hi]
    result["h2d_bytes_per_step"] = eng.off.bytes["h2d"] / max(1, state["zo2"])


def part_memory(out: Path, result: dict, model: str, *, seq: int | None = None, device: str = "cuda") -> None:
    """Peak GPU memory of the four methods at ``model``'s shape, batch 32."""
    import torch

    from harness.experiments.paper_claims import sparq_table2_row

    dev = torch.device(device)
    seq = seq or SEQ[model]
    result["config"] = {"model": model, "batch_size": BATCH, "seq_len": seq, "steps": 2, "dtype": "float32",
                        "micro_batches": 1, "backend": "threads (ranks share the one GPU)"}
    try:
        paper = sparq_table2_row(PAPER_ROW.get(model, "no row for this model"))
        result["paper_row"] = PAPER_ROW[model]
    except (KeyError, OSError, ValueError) as e:
        paper, result["paper_error"] = {}, str(e)
    runs = result["runs"] = []
    for algo, world, params in MEMORY_RUNS:
        row = {"algorithm": algo, "world_size": world, "params": params}
        pm = paper.get(PAPER_METHOD[algo], {})
        row["paper_gb"] = pm.get("memory")
        row["paper_storage_gb"] = pm.get("memory_storage")
        runs.append(row)
        try:
            _free_cuda()
            _reset_peak(dev)
            t0 = time.perf_counter()
            rec = run_on(memory_config(algo, world, params, model, seq), dev)
            row["seconds"] = time.perf_counter() - t0
            row["gpu_peak_bytes"] = metric(rec, "peak_tensor_bytes")
            row["gpu_peak_after_run_bytes"] = _max_alloc(dev)
            row["step_time_s"] = metric(rec, "step_time_s")
            row["final_loss"] = metric(rec, "final_loss")
            row["peak_memory_source"] = rec.env.get("peak_memory_source")
            row["status"] = "ok"
            del rec
        except Exception as e:  # noqa: BLE001 - recorded, the next run goes on
            row["status"] = "failed"
            row["reason"] = f"{type(e).__name__}: {str(e)[:400]}"
        write_json(out / f"{result['part']}.json", result)  # partial results survive a time-out
    peaks = {r["algorithm"]: r.get("gpu_peak_bytes") for r in runs}
    fo = peaks.get("fo-sgd")
    for zo in ("mezo", "sparq"):
        if fo and peaks.get(zo):
            result[f"fo_over_{zo}"] = fo / peaks[zo]
    if paper:
        pf, pz = paper.get("FO-SGD", {}).get("memory"), paper.get("ZO-SGD", {}).get("memory")
        result["paper_fo_over_zo"] = pf / pz if pf and pz else None
    result["claim"] = {"quote": "the memory overhead for first-order methods is over 3x more than that for "
                                "memory-efficient zeroth-order methods", "where": "SparQ App. B.2",
                       "threshold": FO_ZO_CLAIM}
    if any(r.get("status") == "failed" for r in runs):
        result["status"] = "failed"
        result["reason"] = "; ".join(f"{r['algorithm']}: {r['reason']}" for r in runs if r.get("status") == "failed")


def part_cpu_meter(out: Path, result: dict) -> None:
    """The CPU tensor-bytes meter against max_memory_allocated, for the same configs."""
    import dataclasses

    import torch

    from harness.launcher import run

    dev = torch.device("cuda", 0)
    model = "opt-125m"
    result["config"] = {"model": model, "batch_size": BATCH, "seq_len": CAL_SEQ, "steps": 2, "dtype": "float32"}
    threads = max(1, (os.cpu_count() or 2))
    runs = result["runs"] = []
    for algo, world, params in MEMORY_RUNS:
        row = {"algorithm": algo, "world_size": world}
        runs.append(row)
        cfg = memory_config(algo, world, params, model, CAL_SEQ)
        try:
            _free_cuda()
            row["gpu_bytes"] = metric(run_on(cfg, dev), "peak_tensor_bytes")
            _free_cuda()
            t0 = time.perf_counter()
            rec = run(dataclasses.replace(cfg, memory="tensor", threads_per_rank=max(1, threads // world)))
            row["cpu_seconds"] = time.perf_counter() - t0
            row["cpu_tensor_bytes"] = metric(rec, "peak_tensor_bytes")
            if row["gpu_bytes"] and row["cpu_tensor_bytes"]:
                row["cpu_over_gpu"] = row["cpu_tensor_bytes"] / row["gpu_bytes"]
            row["status"] = "ok"
        except Exception as e:  # noqa: BLE001
            row["status"] = "failed"
            row["reason"] = f"{type(e).__name__}: {str(e)[:400]}"
        write_json(out / "cpu-meter.json", result)
    if any(r.get("status") == "failed" for r in runs):
        result["status"] = "failed"
        result["reason"] = "; ".join(f"{r['algorithm']}: {r['reason']}" for r in runs if r.get("status") == "failed")


def run_part(name: str, out: Path) -> int:
    """One part, in this process; writes ``<name>.json`` whatever happens."""
    result = {"schema": SCHEMA, "part": name, "status": "ok"}
    t0 = time.perf_counter()
    try:
        if name == "checks":
            part_checks(out, result)
        elif name == "zo2":
            part_zo2(out, result)
        elif name.startswith("memory-"):
            part_memory(out, result, name.removeprefix("memory-"))
        elif name == "cpu-meter":
            part_cpu_meter(out, result)
        else:
            raise ValueError(f"unknown part {name!r}; parts: {', '.join(PARTS)}")
    except Exception as e:  # noqa: BLE001
        import traceback

        result["status"] = "failed"
        result["reason"] = f"{type(e).__name__}: {str(e)[:400]}"
        result["traceback"] = traceback.format_exc()[-3000:]
    result["seconds"] = time.perf_counter() - t0
    write_json(out / f"{name}.json", result)
    return 0 if result["status"] == "ok" else 1


# --------------------------------------------------------------------------- orchestration
def run_all(out: Path, parts: list[str], scale: float = 1.0) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    summary = {"schema": SCHEMA, "fixture": False, "parts": {}}
    reason = cuda_reason()
    summary["cuda"] = reason is None
    try:
        summary["env"] = environment()
    except Exception as e:  # noqa: BLE001
        summary["env"] = {"error": f"{type(e).__name__}: {e}"}
    if reason is not None:
        print(f"gpu-check: CUDA parts skipped: {reason}", flush=True)
        summary["skipped_reason"] = reason
        for name in parts:
            summary["parts"][name] = {"status": "skipped", "reason": reason}
        finish(out, summary)
        return summary
    t_all = time.perf_counter()
    for name in parts:
        cap = PARTS[name] * scale
        print(f"gpu-check: {name} (cap {cap:.0f} s) ...", flush=True)
        t0 = time.perf_counter()
        log = out / f"{name}.log"
        status, why = "ok", None
        try:
            with open(log, "w") as f:
                proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "part", name, "--out", str(out)],
                                      cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=cap,
                                      env={**os.environ, "PYTHONPATH": str(ROOT)})
            if proc.returncode != 0:
                status = "failed"
        except subprocess.TimeoutExpired:
            status, why = "timeout", f"ran past its cap of {cap:.0f} s (partial records kept)"
        rec_path = out / f"{name}.json"
        rec = {}
        if rec_path.exists():
            with contextlib.suppress(ValueError):
                rec = json.loads(rec_path.read_text())
        if status == "ok" and rec.get("status") not in (None, "ok"):
            status = rec["status"]
        if status != "ok" and why is None:
            why = rec.get("reason") or _tail(log)
        if status == "ok" and not rec:
            status, why = "failed", "wrote no record: " + _tail(log)
        summary["parts"][name] = {"status": status, "seconds": round(time.perf_counter() - t0, 1),
                                  **({"reason": why} if why else {})}
        print(f"gpu-check: {name}: {status} in {time.perf_counter() - t0:.0f} s" + (f" ({why})" if why else ""),
              flush=True)
    summary["seconds"] = round(time.perf_counter() - t_all, 1)
    finish(out, summary)
    return summary


def _tail(path: Path, n: int = 400) -> str:
    try:
        return path.read_text()[-n:].strip().replace("\n", " | ")
    except OSError:
        return "no log"


def finish(out: Path, summary: dict) -> None:
    write_json(out / "summary.json", summary)
    md = table(out)
    (out / "summary.md").write_text(md)
    print(md)
    print(f"gpu-check: records and summary in {out}")


# --------------------------------------------------------------------------- table
def load(directory: Path) -> tuple[dict, dict[str, dict]]:
    """(summary, part records by name) of a directory written by ``run``; validated lightly."""
    directory = Path(directory)
    summary = json.loads((directory / "summary.json").read_text())
    if summary.get("schema") != SCHEMA:
        raise ValueError(f"{directory}/summary.json is not a {SCHEMA} summary")
    parts = {}
    for name in summary.get("parts", {}):
        f = directory / f"{name}.json"
        if f.exists():
            parts[name] = json.loads(f.read_text())
    return summary, parts


def _gb(x) -> str:
    return "—" if x is None else f"{x / GB:.2f}"


def _num(x, fmt="{:.2f}") -> str:
    return "—" if x is None else fmt.format(x)


def table(directory: Path) -> str:
    """The Markdown summary of a directory of records."""
    summary, parts = load(directory)
    env = summary.get("env", {})
    lines = []
    if summary.get("fixture"):
        lines += ["**FIXTURE — not measured on any GPU; the shape of the table only.**", ""]
    lines += ["| device | driver | torch | CUDA | commit |", "|---|---|---|---|---|",
              f"| {env.get('device', '—')} | {env.get('driver') or '—'} | {env.get('torch', '—')} | "
              f"{env.get('cuda_runtime') or '—'} | {(env.get('git_sha') or '—')[:10]} |", ""]
    if not summary.get("cuda"):
        lines += [f"CUDA parts skipped: {summary.get('skipped_reason', 'no CUDA')}", ""]
    lines += ["| part | status | seconds | note |", "|---|---|---|---|"]
    for name, st in summary.get("parts", {}).items():
        lines.append(f"| {name} | {st.get('status')} | {_num(st.get('seconds'), '{:.0f}')} | "
                     f"{str(st.get('reason', ''))[:120].replace('|', '/')} |")
    lines.append("")
    chk = parts.get("checks", {})
    if chk.get("tests"):
        lines += ["| CUDA check | outcome |", "|---|---|"]
        lines += [f"| `{t['id'].rsplit('.', 1)[-1]}` | {t['outcome']} |" for t in chk["tests"]]
        lines.append("")
    z = parts.get("zo2", {})
    if z.get("zo2_step_median_iqr_s"):
        c, ov = z.get("config", {}), z.get("overlap", {})
        zs, ms, r = z["zo2_step_median_iqr_s"], z["mezo_step_median_iqr_s"], z["zo2_throughput_vs_mezo"]
        lines += [f"ZO2 at {c.get('model')} (batch {c.get('batch_size')}, seq {c.get('seq_len')}, "
                  f"{c.get('rounds')} interleaved rounds; median [IQR], ratio with 95% bootstrap CI):", "",
                  "| ZO2 step (ms) | MeZO resident step (ms) | ZO2 throughput / MeZO | uploads hidden by compute "
                  "| offloads hidden by compute | ZO2 peak (GB) | MeZO peak (GB) |",
                  "|---|---|---|---|---|---|---|",
                  f"| {zs[0] * 1e3:.1f} [{zs[1] * 1e3:.1f}, {zs[2] * 1e3:.1f}] | {ms[0] * 1e3:.1f} "
                  f"[{ms[1] * 1e3:.1f}, {ms[2] * 1e3:.1f}] | {r[0]:.2f} [{r[1]:.2f}, {r[2]:.2f}] | "
                  f"{_num(ov.get('upload_overlapped_fraction'), '{:.0%}')} | "
                  f"{_num(ov.get('offload_overlapped_fraction'), '{:.0%}')} | {_gb(z.get('zo2_peak_bytes'))} | "
                  f"{_gb(z.get('mezo_peak_bytes'))} |", ""]
    for name in ("memory-opt-125m", "memory-opt-1.3b"):
        m = parts.get(name, {})
        if not m.get("runs"):
            continue
        c = m.get("config", {})
        lines += [f"Peak GPU memory at {c.get('model')} (batch {c.get('batch_size')}, seq {c.get('seq_len')}, "
                  f"{c.get('dtype', 'float32')}; 2-stage runs: both stages on the one GPU) beside SparQ Table 2 "
                  f"({m.get('paper_row', '—')}: P = 5, the paper's precision; ours P = 1, synthetic weights):", "",
                  "| method | ours (GB) | paper (GB) |", "|---|---|---|"]
        for r in m["runs"]:
            paper = _num(r.get("paper_gb"), "{:g}")
            if r.get("paper_storage_gb") is not None:
                paper += f" + {r['paper_storage_gb']:g} storage"
            ours = _gb(r.get("gpu_peak_bytes")) if r.get("status") == "ok" else f"failed: {r.get('reason', '')[:60]}"
            lines.append(f"| {r['algorithm']} | {ours} | {paper} |")
        fz = m.get("fo_over_mezo")
        verdict = "—" if fz is None else ("supports" if fz > FO_ZO_CLAIM else "does not support")
        lines += ["", f"FO / ZO peak memory: ours {_num(fz)}x (FO-SGD / MeZO), "
                  f"{_num(m.get('fo_over_sparq'))}x (FO-SGD / SparQ); paper's Table 2 row "
                  f"{_num(m.get('paper_fo_over_zo'))}x; App. B.2 \"> 3x\": {verdict}.", ""]
    cal = parts.get("cpu-meter", {})
    if cal.get("runs"):
        c = cal.get("config", {})
        lines += [f"CPU tensor-bytes meter against the GPU, same configs ({c.get('model')}, batch "
                  f"{c.get('batch_size')}, seq {c.get('seq_len')}):", "",
                  "| method | GPU max_memory_allocated (GB) | CPU tensor meter (GB) | CPU / GPU |", "|---|---|---|---|"]
        for r in cal["runs"]:
            lines.append(f"| {r['algorithm']} | {_gb(r.get('gpu_bytes'))} | {_gb(r.get('cpu_tensor_bytes'))} | "
                         f"{_num(r.get('cpu_over_gpu'), '{:.3f}')} |")
        lines.append("")
    lines.append("nccl with several ranks needs several GPUs: this check runs on one GPU and does not "
                 "run it (its 2-stage runs put both ranks on the one GPU through the threads backend).")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd")
    r = sub.add_parser("run", help="run the parts (default)")
    r.add_argument("--out", default=os.environ.get("OUT") or None)
    r.add_argument("--parts", default=",".join(PARTS), help="comma-separated, from: " + ", ".join(PARTS))
    r.add_argument("--cap-scale", type=float, default=1.0, help="multiply every part's time cap")
    p = sub.add_parser("part", help="one part in this process (what run starts)")
    p.add_argument("name", choices=list(PARTS))
    p.add_argument("--out", required=True)
    t = sub.add_parser("table", help="the Markdown table of a directory of records")
    t.add_argument("directory")
    args = ap.parse_args(argv if argv is not None else sys.argv[1:] or ["run"])
    if args.cmd == "table":
        try:
            sys.stdout.write(table(Path(args.directory)))
        except (OSError, ValueError) as e:
            print(f"gpu-check table: {e}", file=sys.stderr)
            return 2
        return 0
    if args.cmd == "part":
        return run_part(args.name, Path(args.out))
    parts = [x for x in args.parts.split(",") if x]
    bad = [x for x in parts if x not in PARTS]
    if bad:
        print(f"gpu-check: unknown parts {', '.join(bad)}; choose from {', '.join(PARTS)}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="gpu-check-"))
    run_all(out, parts, args.cap_scale)
    return 0


if __name__ == "__main__":
    sys.exit(main())
