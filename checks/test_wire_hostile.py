"""Hostile input on the wire: malformed frames and payloads are clear errors, never crashes.

Frames (the frame protocol in ``harness.comm.base``): short, long, oversize and
malformed headers and bodies are a ``CommError`` naming the peer, on threads
(frames injected into a mailbox) and on gloo (raw messages sent past the Comm).
Payloads: every decoder turns random bytes, truncations, bit flips and crafted
headers announcing huge tensors into a ``CodecError``; the size bombs run in a
subprocess under an address-space limit, so an attempted huge allocation fails
the check instead of the machine.
"""

from __future__ import annotations

import math
import os
import struct
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.codecs import CodecError, decode, make_codec
from algorithms.codecs._core import (
    FAMILY_DENSE,
    FAMILY_IDS,
    FAMILY_NATURAL,
    FAMILY_QCHANNEL,
    FAMILY_QSTOCH,
    FAMILY_RANDK,
    FAMILY_SPARSE,
    FAMILY_SPARSE_QSTOCH,
    FAMILY_TOPK,
    build_header,
    seal,
)
from harness.comm import CommError, ThreadsWorld
from harness.comm.base import FRAME_END, FRAME_MAGIC, tag_hash

from ._gloo import run_gloo

SPECS = ("identity", "fp16", "qstoch:bits=4", "qchannel:bits=4", "qchannel:bits=4,format=coo",
         "topk:k=5", "topk:k=5,format=coo", "randk:k=5,scaled=true", "sparse", "sparse:format=coo",
         "natural", "sparse-qstoch:bits=4", "ids:vocab=300")


# ============================================================================ frames
def _header(n: int, tag: str = "", magic: bytes = FRAME_MAGIC) -> bytes:
    return struct.pack("<IQ2s", tag_hash(tag), n, magic)


def _body(payload: bytes, end: bytes = FRAME_END) -> torch.Tensor:
    return torch.frombuffer(bytearray(payload + end), dtype=torch.uint8) if payload + end else \
        torch.empty(0, dtype=torch.uint8)


# (name, header bytes, body tensor): each must be refused
def _malformed_frames(n: int, data: bytes, extra: int, cut: int, junk: bytes) -> list:
    full = data[:n]
    return [
        ("short body", _header(n), _body(full[: n - cut] if cut <= n else b"", b"")),
        ("short body, end marker early", _header(n), _body(full[: max(0, n - cut)])),
        ("long body", _header(n), _body(full + bytes(extra))),
        ("oversize", _header(2**40), _body(b"")),
        ("oversize vs max_frame_bytes", _header(4096 + n), _body(bytes(4096 + n))),
        ("bad magic", _header(n, magic=b"\x00\x00"), _body(full)),
        ("wrong tag", _header(n, tag="other"), _body(full)),
        ("short header", _header(n)[: 14 - max(1, cut % 14)], _body(full)),
        ("long header", _header(n) + b"\x01", _body(full)),
        ("random header", junk[:14], _body(full)),
        ("no end marker", _header(n), _body(full, b"\x00\x00")),
    ]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 300), st.binary(min_size=300, max_size=300), st.integers(1, 64),
       st.integers(1, 40), st.binary(min_size=14, max_size=14))
def test_threads_malformed_frames_are_comm_errors_naming_the_peer(n, data, extra, cut, junk):
    for name, header, body in _malformed_frames(n, data, extra, cut, junk):
        if name == "random header" and junk.endswith(FRAME_MAGIC) and junk[:4] == _header(n)[:4]:
            continue  # a well-formed header by chance
        world = ThreadsWorld(2, timeout_s=5.0)
        comm = world.comm(0, max_frame_bytes=4096)
        world.mail[(1, 0)] = __import__("collections").deque([(1, header, body)])
        with pytest.raises(CommError, match="rank 1") as e:
            comm.recv(1)
        assert "rank 0" in str(e.value), name
    # the well-formed frame passes (the injection path is the real one)
    world = ThreadsWorld(2, timeout_s=5.0)
    comm = world.comm(0, max_frame_bytes=4096)
    world.mail[(1, 0)] = __import__("collections").deque([(1, _header(n), _body(data[:n]))])
    assert bytes(comm.recv(1).tolist()) == data[:n]


def test_send_refuses_a_message_above_the_maximum_frame_size():
    world = ThreadsWorld(2, timeout_s=5.0)
    comm = world.comm(0, max_frame_bytes=10)
    with pytest.raises(CommError, match="maximum frame size 10"):
        comm.send(torch.zeros(11, dtype=torch.uint8), 1)
    comm.send(torch.zeros(10, dtype=torch.uint8), 1)
    with pytest.raises(ValueError, match="max_frame_bytes"):
        world.comm(1, max_frame_bytes=0)


# gloo: rank 1 sends raw transport messages, rank 0 receives through the Comm.  Each
# case consumes exactly the messages sent, so the pair stays in step and one group
# serves all cases.
_GLOO_CASES = (
    ("short header", [_header(3)[:10]]),
    ("long header", [_header(3) + b"\x01\x02\x03"]),
    ("oversize", [_header(2**40)]),
    ("bad magic", [_header(3, magic=b"ab")]),
    ("short body", [_header(300), bytes(100) + FRAME_END]),
    ("long body", [_header(3), b"abc" + FRAME_END + bytes(500)]),
    ("no end marker", [_header(3), b"abcde"]),
)


def _gloo_hostile(comm):
    import torch.distributed as dist

    out = []
    for _, messages in _GLOO_CASES:
        if comm.rank == 1:
            for m in messages:
                dist.send(torch.frombuffer(bytearray(m), dtype=torch.uint8), 0)
        else:
            try:
                comm.recv(1)
                out.append("no error")
            except CommError as e:
                out.append(str(e))
        comm.barrier()
    if comm.rank == 1:  # the Comm still works afterwards: a well-formed frame
        comm.send(torch.arange(5, dtype=torch.uint8), 0)
    else:
        out.append(comm.recv(1).tolist())
    return out


@pytest.mark.gloo
def test_gloo_malformed_frames_are_comm_errors_not_aborts():
    res = run_gloo(2, _gloo_hostile, timeout_s=30)[0]
    for (name, _), msg in zip(_GLOO_CASES, res, strict=False):
        assert "rank 1" in msg and "rank 0" in msg, (name, msg)
    assert res[-1] == [0, 1, 2, 3, 4]


# ============================================================================ payloads
def _sample(spec: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if spec.startswith("ids"):
        return torch.randint(0, 300, (3, 7), generator=g)
    x = torch.randn(3, 8, generator=g)
    if spec.startswith("sparse"):
        x[x.abs() < 0.7] = 0
    return x


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(SPECS), st.integers(0, 2**31 - 1), st.data())
def test_decoders_refuse_truncations_bit_flips_and_random_bytes(spec, seed, data):
    c = make_codec(spec)
    p = c.encode(_sample(spec, seed), torch.Generator().manual_seed(seed))
    raw = bytes(p.data.tolist())
    decode(p)  # the unharmed payload decodes
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(CodecError):
        decode(raw[:cut])
    with pytest.raises(CodecError):
        decode(raw + data.draw(st.binary(min_size=1, max_size=8)))
    # every single bit flip is caught (header CRC, body CRC): never a silent wrong tensor
    bit = data.draw(st.integers(0, 8 * len(raw) - 1))
    flipped = bytearray(raw)
    flipped[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(CodecError):
        decode(bytes(flipped))
    junk = data.draw(st.binary(min_size=0, max_size=64))
    with pytest.raises(CodecError):
        decode(junk)
    with pytest.raises(CodecError):  # a valid magic, version and family, then junk
        decode(raw[:4] + junk)


# crafted, well-checksummed headers announcing huge tensors over an empty or tiny body
_BOMB_SHAPES = ((2**32 - 1,), (2**16, 2**16), (2**20, 2**20), (2**20, 2**20, 2**20), (2**28 + 1,))


def _bombs() -> list[tuple[str, bytes]]:
    out = []
    for shape in _BOMB_SHAPES:
        for fam, dtype, params in (
            (FAMILY_SPARSE, torch.float32, struct.pack("<BBBI", 0, 0, 2, 0)),
            (FAMILY_TOPK, torch.float32, struct.pack("<BBBI", 0, 0, 2, 0)),
            (FAMILY_RANDK, torch.float32, struct.pack("<BBBI", 0, 0, 2, 0)),
            (FAMILY_QCHANNEL, torch.float32, struct.pack("<BBBI", 4, 3, 2, 0)),
            (FAMILY_SPARSE_QSTOCH, torch.float32, struct.pack("<BfI", 4, 0.0, 0)),
            (FAMILY_DENSE, torch.float32, struct.pack("<B", 1)),
            (FAMILY_QSTOCH, torch.float32, struct.pack("<Bf", 4, 0.0)),
            (FAMILY_NATURAL, torch.float32, struct.pack("<B", 9)),
            (FAMILY_IDS, torch.int64, struct.pack("<I", 299)),
        ):
            head = build_header(fam, dtype, shape, params)
            t = torch.frombuffer(bytearray(head + bytes(2 if fam == FAMILY_QCHANNEL else 0)), dtype=torch.uint8)
            seal(t)
            out.append((f"{fam}:" + "x".join(map(str, shape)), bytes(t.tolist())))
    return out


_BOMB_RUNNER = textwrap.dedent("""
    import pickle, resource, sys
    bombs = pickle.load(sys.stdin.buffer)
    import torch
    from algorithms.codecs import CodecError, decode
    def vm_bytes():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * resource.getpagesize()
    limit = vm_bytes() + (2 << 30)  # 2 GiB above what the interpreter holds now
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    for name, raw in bombs:
        try:
            decode(raw)
            print(name, "decoded", flush=True)
        except CodecError as e:
            print(name, "CodecError", str(e)[:60], flush=True)
        except MemoryError as e:
            print(name, "MemoryError", flush=True)
        except RuntimeError as e:
            print(name, "RuntimeError", str(e)[:60], flush=True)
""")


def test_decoders_refuse_size_bombs_under_an_address_space_limit():
    import pickle

    bombs = _bombs()
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.run([sys.executable, "-c", _BOMB_RUNNER], input=pickle.dumps(bombs),
                          capture_output=True, env=env, timeout=120, check=False)
    lines = proc.stdout.decode().splitlines()
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert len(lines) == len(bombs), proc.stdout.decode()
    for (name, raw), line in zip(bombs, lines, strict=True):
        assert line.split()[0] == name and line.split()[1] == "CodecError", (len(raw), line)
    assert math.prod(_BOMB_SHAPES[0]) >= 2**32 - 1 and min(len(r) for _, r in bombs) <= 30


def test_non_finite_scales_are_refused_by_every_scaled_decoder():
    for delta in (float("nan"), float("inf"), -float("inf")):
        for fam, params, body in ((FAMILY_QSTOCH, struct.pack("<Bf", 4, delta), bytes(2)),
                                  (FAMILY_SPARSE_QSTOCH, struct.pack("<BfI", 4, delta, 1), bytes(2))):
            t = torch.frombuffer(bytearray(build_header(fam, torch.float32, (4,), params) + body),
                                 dtype=torch.uint8)
            seal(t)
            with pytest.raises(CodecError, match="scale"):
                decode(t)
    fp16_inf = struct.pack("<e", float("inf"))  # qchannel's per-channel scale, float16 in the body
    t = torch.frombuffer(bytearray(build_header(FAMILY_QCHANNEL, torch.float32, (4,), struct.pack("<BBBI", 4, 3, 0, 0))
                                   + fp16_inf + bytes(2)), dtype=torch.uint8)
    seal(t)
    with pytest.raises(CodecError, match="scale"):
        decode(t)
