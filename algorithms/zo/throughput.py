"""DistZO2's throughput model (paper App. C, Eqs. 3-4) from measured link rates.

    T_block = M / (n B_PCIe) + (n - 1) M / (n B_NVLink)        (Eq. 3, one block's upload)
    T_step  = max(N T_block, T_comp)                            (Eq. 4, streams overlap)

``M`` in bytes, rates in bytes/s.  On this CPU test-bed "PCIe" is the host ->
device-pool copy and "NVLink" the Comm all-gather of the sliced transfer, both
timed inside the run (:class:`~.offload.BlockOffloader` accumulates bytes and
seconds per link).  The paper adds the two stages (Eq. 3); across blocks they
pipeline, so the steady state is their max (Eq. 3 is one block's latency) —
both are reported.  This is a model evaluated at measured rates, never a measurement.
"""

from __future__ import annotations


def t_block(block_bytes: float, n: int, b_pcie: float, b_nvlink: float | None) -> float:
    """Eq. 3: seconds to bring one block onto a device with ``n``-way slicing."""
    t = block_bytes / (n * b_pcie)
    if n > 1:
        t += (n - 1) * block_bytes / (n * b_nvlink)
    return t


def t_block_pipelined(block_bytes: float, n: int, b_pcie: float, b_nvlink: float | None) -> float:
    """Steady-state per-block time when PCIe and peer stages of successive blocks overlap."""
    if n == 1:
        return block_bytes / b_pcie
    return max(block_bytes / (n * b_pcie), (n - 1) * block_bytes / (n * b_nvlink))


def t_step(num_blocks: int, t_blk: float, t_comp: float) -> float:
    """Eq. 4: step time when transfers and compute overlap."""
    return max(num_blocks * t_blk, t_comp)


def rate(nbytes: float, seconds: float) -> float | None:
    return nbytes / seconds if seconds > 0 and nbytes > 0 else None


def model_extras(off, *, compute_s: float, steps: int) -> dict[str, tuple[float, str]]:
    """The model's prediction next to its inputs, as ``ctx.extra`` entries."""
    b_pcie = rate(off.bytes["h2d"], off.seconds["h2d"])
    b_nv = rate(off.bytes["d2d"], off.seconds["d2d"])
    if b_pcie is None or steps < 1 or (off.n > 1 and b_nv is None):
        return {}
    block = max(off.numel) * off.esize
    tb = t_block(block, off.n, b_pcie, b_nv)
    t_comp = compute_s / steps
    out = {"link_rate_h2d": (b_pcie, "bytes/s"),
           "model_t_block_s": (tb, "s"),
           "model_t_block_pipelined_s": (t_block_pipelined(block, off.n, b_pcie, b_nv), "s"),
           "model_t_comp_s": (t_comp, "s"),
           "model_t_step_s": (t_step(len(off.numel), tb, t_comp), "s")}
    if b_nv is not None:
        out["link_rate_d2d"] = (b_nv, "bytes/s")
    return out
