"""Bulk uniform random words for stochastic codecs, and the block thread pool.

All randomness comes from the caller's ``torch.Generator``: one 63-bit seed is
drawn from it (``torch.randint``).  The element range is cut into blocks of
``BLOCK_RAW`` 64-bit words (``4 * BLOCK_RAW`` 16-bit or ``2 * BLOCK_RAW``
32-bit words); block ``j`` is the raw output of a numpy SFC64 generator seeded
with ``SeedSequence(seed, spawn_key=(j,))`` (independent streams by
construction).  The words therefore depend only on the seed, never on the
number of threads; same generator state -> same words.

Why not ``torch.rand``: the CPU generator is a serial Mersenne twister that
draws 32 bits per element, about 10x a copy of the input on a 4M-element
tensor; stochastic rounding needs 16 bits per element, and blocks can be
generated in parallel (numpy releases the GIL) next to the arithmetic that
consumes them while it is still in cache.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

BLOCK_RAW = 1 << 16  # 64-bit words per block (512 KiB)
_PARALLEL_MIN_BLOCKS = 2
_pool: ThreadPoolExecutor | None = None
_pool_pid = -1
_pool_lock = threading.Lock()


def _count_cores() -> int:
    return os.cpu_count() or 1  # unknown: 1


_CORES = _count_cores()  # once: os.cpu_count() costs ~5 us, a third of a small message's encode


def pool_workers() -> int:
    """Threads the codec pool runs blocks on: the intra-op thread count, at most the cores and 4."""
    return min(4, _CORES, max(1, torch.get_num_threads()))


def _executor() -> ThreadPoolExecutor | None:
    global _pool, _pool_pid
    workers = pool_workers()
    if workers < 2:
        return None
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():  # recreate after fork
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="codec")
            _pool_pid = os.getpid()
        return _pool


def run_blocks(fn: Callable[[int], object], nblocks: int) -> list[object]:
    """Run ``fn(j)`` for every block, in the pool when there are several blocks."""
    pool = _executor() if nblocks >= _PARALLEL_MIN_BLOCKS else None
    if pool is None:
        return [fn(j) for j in range(nblocks)]
    return list(pool.map(fn, range(nblocks)))


def draw_seed(generator: torch.Generator | None) -> int:
    """One 63-bit seed from ``generator`` (the default CPU generator if None)."""
    return int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64, generator=generator))


def elements_per_block(bits: int) -> int:
    return BLOCK_RAW * (64 // bits)


def block_state(seed: int, j: int) -> np.ndarray:
    """The SFC64 state (a, b, c, counter) that block ``j``'s words start from (uint64[4]),
    from numpy itself (about 30 us a block; :func:`block_states` computes the same)."""
    g = np.random.SFC64(np.random.SeedSequence(seed, spawn_key=(j,)))
    return np.array(g.state["state"]["state"], dtype=np.uint64)


def block_states(seed: int, first: int, out: np.ndarray) -> None:
    """``out[g]`` = :func:`block_state` ``(seed, first + g)``, compiled
    (``_kernels.sfc64_block_states``: numpy's SeedSequence and SFC64 seeding, re-done)."""
    from . import _kernels  # compiled on first use

    if not 0 <= seed < 2**64 or first + len(out) > 2**32:  # pragma: no cover - programming error
        raise AssertionError("block_states: a seed of 64 bits, fewer than 2**32 blocks")
    run = np.array([seed & 0xFFFFFFFF, seed >> 32, 0, 0], dtype=np.uint32)  # padded to the pool's 4
    _kernels.sfc64_block_states(run, first, out)


def block_words(seed: int, j: int, count: int, bits: int) -> np.ndarray:
    """Words ``[j*E, j*E + count)`` of the stream (``E = elements_per_block(bits)``)."""
    per = 64 // bits
    g = np.random.SFC64(np.random.SeedSequence(seed, spawn_key=(j,)))
    raw = g.random_raw((count + per - 1) // per)
    return raw.view(np.int16 if bits == 16 else np.int32)[:count]


def random_words(count: int, bits: int, generator: torch.Generator | None) -> torch.Tensor:
    """``count`` independent uniform words of ``bits`` (16 or 32) bits.

    Returned as int16 / int32 (two's complement), i.e. uniform on
    ``[-2**(bits-1), 2**(bits-1))``.
    """
    if bits not in (16, 32):  # pragma: no cover - programming error
        raise AssertionError("bits must be 16 or 32")
    seed = draw_seed(generator)
    return torch.from_numpy(stream_words(seed, count, bits))


def stream_words(seed: int, count: int, bits: int) -> np.ndarray:
    out = np.empty(count, dtype=np.int16 if bits == 16 else np.int32)
    per_block = elements_per_block(bits)

    def fill(j: int) -> None:
        lo = j * per_block
        hi = min(count, lo + per_block)
        out[lo:hi] = block_words(seed, j, hi - lo, bits)

    run_blocks(fill, (count + per_block - 1) // per_block)
    return out


def blocks(count: int, per_block: int) -> Iterable[tuple[int, int]]:
    return ((lo, min(count, lo + per_block)) for lo in range(0, count, per_block))
