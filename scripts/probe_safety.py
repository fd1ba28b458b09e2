"""Probe the harness's safety from outside and print what it measured, as one table.

    python3 scripts/probe_safety.py [--quick]

Cases: bad command-line input; ``--out`` at a FIFO, a device node (``mknod``, root), a symbolic
link to one, and two runs started together on one ``--out``; crafted codec payloads and
rank-output frames (bit flips, truncations, extensions, and for every codec headers announcing
more elements than the receiver expects) decoded under ``tracemalloc``; a rank stopped (SIGSTOP)
before the process group forms; SIGINT and SIGTERM on a small gloo run.  Each row counts:
``tried``; ``clear`` (refused or stopped with a one-line message, nothing lost);
``crash/traceback``; ``silent wrong`` (a destructive write, a lost record, a corrupted input
decoded as a value, the wrong rank blamed); ``left behind`` (files or processes that outlive the
case).  Decoding also reports its largest allocation per payload byte.  Every count
is computed from the runs here, never typed.  Needs a few minutes on two cores.
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import stat
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CLI = [sys.executable, "-m", "harness.cli"]
SMALL_RUN = ["run", "fo-sgd", "--steps", "2"]
SLACK = 64 * 1024  # what parsing a header costs the interpreter itself (tracemalloc sees it)


@dataclasses.dataclass
class Row:
    test: str
    tried: int = 0
    clear: int = 0
    crash: int = 0
    silent_wrong: int = 0
    left_behind: int = 0


def _cli(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def _one_clear_line(p: subprocess.CompletedProcess) -> bool:
    err = p.stderr.strip()
    return p.returncode == 2 and "Traceback" not in err and len(err.splitlines()) == 1 and len(err) > 12


def probe_cli() -> Row:
    row = Row("bad CLI input")
    cases = [
        ["run", "no-such-algorithm"], ["run", "fo-sgd", "--steps", "-1"], ["run", "fo-sgd", "--world-size", "0"],
        ["run", "pipeline-sgd", "--world-size", "2", "--bandwidth", "1bit"],
        ["run", "pipeline-sgd", "--world-size", "2", "--bandwidth", "100000gbit"],
        ["run", "aq-sgd", "--set", "dataset_size=1e12"], ["run", "fo-sgd", "--set", "nonsense=1"],
        ["run", "fo-sgd", "--out", "/tmp/" + "x" * 300 + ".json"], ["run", "fo-sgd", "--model", "nope"],
        ["table", "/nonexistent-dir"], ["compare", "/nonexistent-a", "/nonexistent-b"],
        ["reproduce", "no-such-experiment"],
    ]
    for args in cases:
        row.tried += 1
        p = _cli(args)
        if "Traceback" in p.stderr:
            row.crash += 1
        elif p.returncode == 0:
            row.silent_wrong += 1
        elif _one_clear_line(p):
            row.clear += 1
        else:
            print(f"  unclear: {args}: exit {p.returncode}: {p.stderr.strip()[:200]}")
    return row


def _kind(path: Path) -> str:
    try:
        m = os.lstat(path).st_mode
    except FileNotFoundError:
        return "missing"
    return ("link" if stat.S_ISLNK(m) else "fifo" if stat.S_ISFIFO(m) else "char" if stat.S_ISCHR(m)
            else "file" if stat.S_ISREG(m) else "other")


def probe_out_nodes(tmp: Path) -> Row:
    row = Row("--out at non-regular files")
    targets = []
    fifo = tmp / "fifo"
    os.mkfifo(fifo)
    targets.append(fifo)
    if os.geteuid() == 0:  # a device node like /dev/full, made here
        dev = tmp / "full"
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
        targets.append(dev)
        link = tmp / "link-to-full"
        link.symlink_to(dev)
        targets.append(link)
    link_fifo = tmp / "link-to-fifo"
    link_fifo.symlink_to(fifo)
    targets.append(link_fifo)
    for cmd in (SMALL_RUN, ["table", str(ROOT / "checks")]):
        for t in targets:
            row.tried += 1
            before = {p.name: _kind(p) for p in tmp.iterdir()}
            p = _cli([*cmd, "--out", str(t)])
            after = {q.name: _kind(q) for q in tmp.iterdir()}
            if "Traceback" in p.stderr:
                row.crash += 1
            if any(after.get(k) != v for k, v in before.items()):
                row.silent_wrong += 1  # the node (or the link) was replaced
            elif p.returncode == 2 and "Traceback" not in p.stderr:
                row.clear += 1
            if set(after) - set(before):
                row.left_behind += 1
    return row


def probe_concurrent_out(tmp: Path) -> Row:
    row = Row("concurrent --out")
    out = tmp / "same.json"
    procs = [subprocess.Popen([*CLI, *SMALL_RUN, "--seed", str(i), "--out", str(out)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    results = [(p.wait(300), p.stderr.read()) for p in procs]
    row.tried = 1
    records = list(tmp.glob("same*.json"))
    if any("Traceback" in err for _, err in results):
        row.crash += 1
    ok = sum(rc == 0 for rc, _ in results)
    if len(records) < ok + sum(rc != 0 and "beside" in err for rc, err in results):
        row.silent_wrong += 1  # a run said it saved a record that is not there
    else:
        row.clear += 1
    for r in records:
        r.unlink()
    return row


def _nbytes(obj) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    params = getattr(obj, "params", None)  # a RankOutput
    return sum(_nbytes(p) for _, p in params) if params else 0


def _measure_decode(fn, data) -> tuple[str, int, int]:
    """The outcome, tracemalloc's peak (Python's allocator, numpy included) and the bytes of
    the tensors a decode returned (torch allocates outside tracemalloc's view)."""
    tracemalloc.start()
    made = 0
    try:
        made = _nbytes(fn(data))
        outcome = "decoded"
    except Exception as e:  # noqa: BLE001 - the probe classifies whatever a decoder raises
        outcome = type(e).__name__
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return outcome, peak, made


@dataclasses.dataclass
class Alloc:
    """The largest decoded tensor per payload byte, the largest Python-heap peak, and the
    payloads that made a receiver allocate beyond 2x their length (the heap: beside what
    parsing costs the interpreter)."""

    worst: float = 0.0  # largest decoded tensor / payload length
    peak: int = 0  # the largest Python-heap peak, in bytes
    beyond: int = 0

    def add(self, peak: int, made: int, nbytes: int) -> bool:
        self.worst = max(self.worst, made / nbytes)
        self.peak = max(self.peak, peak)
        over = made > 2 * nbytes or peak > 2 * nbytes + SLACK
        self.beyond += over
        return over


def probe_codecs(n_mut: int) -> tuple[Row, Alloc]:
    import torch

    from algorithms.codecs import EXAMPLE_SPECS, CodecError, decode, make_codec
    from algorithms.codecs._core import MAX_ELEMENTS_PER_BYTE, build_header, parse_header, seal

    row = Row("crafted codec payloads")
    rng = random.Random(0)
    alloc = Alloc()
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    x[x.abs() < 0.8] = 0  # sparse enough for the sparse formats to choose an index list
    expect = x.numel()  # a receiver knows the tensor it waits for (decode's max_numel)

    def tried(data: torch.Tensor, what: str, must_refuse: bool) -> None:
        row.tried += 1
        outcome, peak, made = _measure_decode(lambda d: decode(d, max_numel=expect), data)
        if outcome == "decoded" and must_refuse:
            row.silent_wrong += 1
        elif outcome in ("CodecError", "NonFiniteInput") or outcome == "decoded":
            row.clear += 1
        else:
            row.crash += 1
        nbytes = data.numel()
        if alloc.add(peak, made, nbytes):
            print(f"  {what}: a {nbytes}-byte payload made the receiver allocate {max(peak, made)} bytes "
                  f"({outcome})")

    # index-list variants too: with k = 0 their body is empty whatever count the header says
    specs = (*EXAMPLE_SPECS, "sparse:format=coo", "sparse:bits=4,format=coo", "topk:k=16,format=coo",
             "qchannel:bits=4,format=coo", "qchannel:bits=4,granularity=tensor,format=coo",
             "sparse-qstoch:bits=4", "sparse-qstoch:bits=2")
    for spec in specs:
        try:
            good = bytes(make_codec(spec).encode(x.clone()).data.numpy())
        except CodecError:
            continue
        for i in range(n_mut):  # bit flips, truncations, extensions: each must be refused
            b = bytearray(good)
            how = i % 3
            if how == 0:
                for _ in range(rng.randint(1, 3)):
                    b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            elif how == 1:
                del b[rng.randrange(1, len(b)):]
            else:
                b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
            if bytes(b) != good:
                tried(torch.frombuffer(bytearray(b), dtype=torch.uint8), spec, must_refuse=True)
        # crafted headers with valid CRCs, every codec: its own parameters, or with the last
        # four bytes zeroed (the sparse formats' entry count k = 0, so the body may be empty)
        # or all but the first byte's low five bits (sparse-qstoch: its bit width, with the
        # index-list layout, scale 0 and no entries),
        # an element count up to 2**31, and a body of 0 or 2 bytes (qchannel's scale); more than
        # the receiver expects is refused before its tensor exists (with no expectation the
        # per-byte cap would let a 25-byte sparse payload ask for ~6.5 MB)
        hdr = parse_header(torch.frombuffer(bytearray(good), dtype=torch.uint8))
        own, tail = hdr.params, min(4, len(hdr.params))
        first = bytes([own[0] & 0x1F]) if own else b""
        zeroed = (own[:len(own) - tail] + bytes(tail), first + bytes(max(0, len(own) - 1)))
        for params in dict.fromkeys((own, *zeroed)):
            for body in (b"", bytes(2)):
                size = len(build_header(hdr.family, hdr.dtype, (1,), params) + body)
                for n in (expect + 1, size * MAX_ELEMENTS_PER_BYTE, 1 << 31):
                    head = build_header(hdr.family, hdr.dtype, (n,), params)
                    data = torch.frombuffer(bytearray(head + body), dtype=torch.uint8).clone()
                    seal(data)
                    tried(data, f"{spec} announcing {n} elements", must_refuse=True)
    return row, alloc


def probe_rank_output(n_mut: int) -> tuple[Row, Alloc]:
    import torch

    from harness.context import RankOutput
    from harness.rank_output_wire import RankOutputError, decode, encode

    row = Row("rank-output frames")
    out = RankOutput(rank=1, params=[(0, torch.randn(16, 4)), (1, torch.randn(4))], history={"loss": [1.0, 0.5]},
                     step_times=[0.1, 0.2], peak_memory_bytes=1, peak_memory_growth_bytes=0,
                     peak_memory_reset=True, peak_tensor_bytes=None, peak_tensor_growth_bytes=None,
                     sent_bytes=10, sent_messages=2, received_bytes=9, framing_bytes=32,
                     bytes_by_tag={"act": (10, 2)}, tokens_per_step=64, wire_tx_bytes=None,
                     wire_rx_bytes=None, extra={})
    good = encode(out)
    rng = random.Random(1)
    alloc = Alloc()
    for i in range(n_mut):
        b = bytearray(good)
        if i % 3 == 0:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif i % 3 == 1:
            del b[rng.randrange(1, len(b)):]
        else:
            b += bytes(rng.randint(1, 64))
        row.tried += 1
        outcome, peak, made = _measure_decode(lambda d: decode(d, expect_rank=1), bytes(b))
        if outcome == "decoded":
            row.silent_wrong += 1
        elif outcome == RankOutputError.__name__:
            row.clear += 1
        else:
            row.crash += 1
        alloc.add(peak, made, len(b))
    return row, alloc


def _descendants(pid: int) -> set[int]:
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        for k in map(int, kids):
            out.add(k)
            todo.append(k)
    return out


def probe_signals(tmp: Path) -> Row:
    row = Row("SIGINT/SIGTERM on a run")
    for sig in (signal.SIGINT, signal.SIGTERM):
        out = tmp / f"sig{int(sig)}.json"
        p = subprocess.Popen([*CLI, "run", "pipeline-sgd", "--world-size", "2", "--backend", "gloo",
                              "--steps", "100000", "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
        deadline = time.monotonic() + 120
        kids: set[int] = set()
        while time.monotonic() < deadline and len(kids) < 2:  # both ranks are up
            kids |= _descendants(p.pid)
            time.sleep(0.2)
        kids |= _descendants(p.pid)
        p.send_signal(sig)
        row.tried += 1
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            _, err = p.communicate()
            row.crash += 1
            continue
        alive = [k for k in kids if Path(f"/proc/{k}").exists()
                 and "zombie" not in Path(f"/proc/{k}/status").read_text().lower()]
        left = alive or [f for f in tmp.iterdir() if f.name.startswith(f"sig{int(sig)}")]
        if "Traceback" in err:
            row.crash += 1
        elif p.returncode != 0 and err.strip():
            row.clear += 1
        if left:
            row.left_behind += 1
            for k in alive:
                os.kill(k, signal.SIGKILL)
    return row


def _ranks_of(launcher: int) -> dict[int, int]:
    """rank -> pid of the live rank processes a launcher started (from their environment)."""
    found, tag = {}, f"COMMBENCH_LAUNCHER_PID={launcher}".encode()
    for p in Path("/proc").glob("[0-9]*"):
        try:
            env = (p / "environ").read_bytes().split(b"\0")
            state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if tag in env and state != "Z":
            found[next(int(e[5:]) for e in env if e.startswith(b"RANK="))] = int(p.name)
    return found


def probe_rendezvous(tmp: Path) -> Row:
    """Rank 1 of 3 (gloo) stopped while it starts, before the process group forms: the
    launcher must name rank 1 (not the rank whose wait timed out) and leave nothing behind."""
    row = Row("rank stopped before rendezvous")
    p = subprocess.Popen([*CLI, "run", "pipeline-sgd", "--world-size", "3", "--backend", "gloo",
                          "--model", "tiny-opt", "--data", "wiki-en", "--set", "batch_size=4", "--set",
                          "seq_len=16", "--steps", "100000", "--timeout", "6",
                          "--out", str(tmp / "rdv.json")], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    row.tried = 1
    deadline, pid = time.monotonic() + 120, None
    while time.monotonic() < deadline and pid is None and p.poll() is None:
        pid = _ranks_of(p.pid).get(1)
        time.sleep(0.05)  # polling a deadline wait
    if pid is None:
        p.kill()
        print(f"  rendezvous: rank 1 never started: {p.communicate()[1].strip()[:200]}")
        row.crash += 1
        return row
    os.kill(pid, signal.SIGSTOP)
    try:
        _, err = p.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        _, err = p.communicate()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    print(f"  rendezvous stall: exit {p.returncode}: {lines[-1] if lines else ''}")
    if "Traceback" in err:
        row.crash += 1
    elif p.returncode == 1 and len(lines) == 1 and "rank 1 failed" in lines[0]:
        row.clear += 1
    else:
        row.silent_wrong += 1  # the wrong rank blamed, or no message
    left = _ranks_of(p.pid)
    if left or (tmp / "rdv.json").exists():
        row.left_behind += 1
        for k in left.values():
            os.kill(k, signal.SIGKILL)
    return row


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    rows: list[Row] = []
    extra: list[str] = []
    with tempfile.TemporaryDirectory(prefix="cb-probe-") as d:
        tmp = Path(d)
        rows.append(probe_cli())
        rows.append(probe_out_nodes(tmp))
        rows.append(probe_concurrent_out(tmp))
        codec_row, alloc = probe_codecs(30 if quick else 300)
        rows.append(codec_row)
        extra.append(f"codec decodes (a receiver expecting 512 float32 elements): decoded tensors at "
                     f"most {alloc.worst:.1f} x the payload, Python heap peak {alloc.peak} bytes; "
                     f"{alloc.beyond} beyond 2 x the payload (heap: + 64 KiB for parsing)")
        ro_row, alloc = probe_rank_output(60 if quick else 1000)
        rows.append(ro_row)
        extra.append(f"rank-output decodes: decoded tensors at most {alloc.worst:.1f} x the frame, "
                     f"Python heap peak {alloc.peak} bytes; {alloc.beyond} beyond 2 x the frame "
                     "(heap: + 64 KiB)")
        rows.append(probe_rendezvous(tmp))
        if not quick:
            rows.append(probe_signals(tmp))
    print("test | tried | clear | crash/traceback | silent wrong | left behind")
    print("--- | --- | --- | --- | --- | ---")
    for r in rows:
        print(f"{r.test} | {r.tried} | {r.clear} | {r.crash} | {r.silent_wrong} | {r.left_behind}")
    for line in extra:
        print(line)
    bad = sum(r.crash + r.silent_wrong + r.left_behind for r in rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
