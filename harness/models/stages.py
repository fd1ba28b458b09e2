"""Pipeline stages: cutting a model into consecutive pieces that share its parameters.

:func:`split_model` cuts a model into consecutive :class:`Stage` modules that
share its parameters.  ``cut="block"`` cuts between transformer blocks (the
hidden state crosses); ``cut="ffn_act"`` cuts inside a block right after its
FFN activation (OPT: relu(fc1 x); GPT-2: gelu(c_fc x); Llama: silu(gate x) ·
up x, the input of down_proj), and then both the FFN activation and the
residual stream cross.  Chaining the stages reproduces ``model(ids).logits``
bit for bit, and so do the parameter gradients (the family adapters,
:mod:`.adapters`, repeat the ``transformers`` layer code).  Each stage
recomputes the causal mask and the positions locally from the sequence length
(our batches are never padded), so neither crosses the wire.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from .adapters import _FAMILIES
from .families import _family_of
from .presets import _preset
from .weights import _materialise, _meta_model, build_model

__all__ = ["Stage", "TensorSpec", "build_stage", "default_boundaries", "max_stages", "model_info",
           "split_model"]

CUTS = ("block", "ffn_act")


@dataclass(frozen=True)
class TensorSpec:
    """Name, shape and dtype of a tensor that enters or leaves a stage."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class _Plan:
    index: int
    num_stages: int
    cut: str
    post_block: int | None
    blocks: tuple[int, ...]
    pre_block: int | None
    boundaries: tuple[int, ...] = field(default=())


class Stage(nn.Module):
    """One consecutive piece of a split model.

    ``forward(*inputs)`` takes the tensors named by ``input_names`` and returns
    a tuple of the tensors named by ``output_names``:

    * first stage input ``("input_ids",)``; last stage output ``("logits",)``
      (``[B, T, vocab]`` for a causal LM, ``[B, num_labels]`` for a classifier);
    * ``cut="block"`` boundaries carry ``("hidden",)`` ``[B, T, d_model]``;
    * ``cut="ffn_act"`` boundaries carry ``("ffn_act", "residual")``:
      ``[B, T, ffn]`` and ``[B, T, d_model]``.

    Attributes: ``index``, ``num_stages``, ``cut``, ``boundaries``,
    ``blocks`` (whole blocks held), ``post_block`` (block whose FFN
    down-projection this stage runs first), ``pre_block`` (block whose first
    part, up to the FFN activation, this stage runs last), ``config``.
    """

    def __init__(self, model: Any, plan: _Plan, global_ids: dict[int, tuple[int, str]]):
        super().__init__()
        config = model.config
        fam = _FAMILIES[_family_of(config)]
        layers = fam.layers(model)
        self.config = config
        self.family = fam.name
        self.index = plan.index
        self.num_stages = plan.num_stages
        self.cut = plan.cut
        self.boundaries = plan.boundaries
        self.blocks = plan.blocks
        self.post_block = plan.post_block
        self.pre_block = plan.pre_block
        self._fam = fam
        first, last = plan.index == 0, plan.index == plan.num_stages - 1
        self.embed = nn.ModuleDict(fam.embed_modules(model) if first else {})
        self.head = nn.ModuleDict(fam.head_modules(model) if last else {})
        self.shared = nn.ModuleDict(fam.shared_modules(model))
        self.post_part = nn.ModuleDict(
            fam.post_modules(layers[plan.post_block]) if plan.post_block is not None else {})
        self.block_modules = nn.ModuleList([layers[i] for i in plan.blocks])
        self.pre_part = nn.ModuleDict(
            fam.pre_modules(layers[plan.pre_block]) if plan.pre_block is not None else {})
        boundary = ("hidden",) if plan.cut == "block" else ("ffn_act", "residual")
        self.input_names: tuple[str, ...] = ("input_ids",) if first else boundary
        self.output_names: tuple[str, ...] = ("logits",) if last else boundary
        entries = []
        for local, p in self.named_parameters():
            idx, name = global_ids[id(p)]
            entries.append((idx, name, local))
        self._entries: list[tuple[int, str, str]] = sorted(entries)

    # -- parameters -----------------------------------------------------------------

    def global_named_parameters(self) -> list[tuple[int, str, nn.Parameter]]:
        """``(global_index, global_name, parameter)`` sorted by global index."""
        return [(i, n, self.get_parameter(local)) for i, n, local in self._entries]

    def global_indices(self) -> list[int]:
        return [i for i, _, _ in self._entries]

    @property
    def dtype(self) -> torch.dtype:
        for p in self.parameters():
            return p.dtype
        return torch.float32

    @property
    def ops(self) -> Any:
        """The model family's ``layers`` / ``embed`` / ``context`` / ``block`` / ``head``
        functions, for engines that walk the blocks themselves (e.g. ZO2's offloading)."""
        return self._fam

    # -- shapes ---------------------------------------------------------------------

    def _spec(self, name: str, batch: int, seq_len: int) -> TensorSpec:
        c = self.config
        if name == "input_ids":
            return TensorSpec(name, (batch, seq_len), torch.int64)
        if name == "logits" and self._fam.classifies:
            return TensorSpec(name, (batch, c.num_labels), self.dtype)
        width = {"hidden": c.hidden_size, "residual": c.hidden_size,
                 "ffn_act": self._fam.ffn_width(c), "logits": c.vocab_size}[name]
        return TensorSpec(name, (batch, seq_len, width), self.dtype)

    def input_specs(self, batch: int, seq_len: int) -> tuple[TensorSpec, ...]:
        return tuple(self._spec(n, batch, seq_len) for n in self.input_names)

    def output_specs(self, batch: int, seq_len: int) -> tuple[TensorSpec, ...]:
        return tuple(self._spec(n, batch, seq_len) for n in self.output_names)

    def largest_numel(self, batch: int, seq_len: int, side: str = "input") -> int:
        """Elements of the largest tensor this stage takes in (``side="input"``) or hands on
        (``"output"``): what a receiving end expects at most (decoders refuse more)."""
        specs = (self.input_specs if side == "input" else self.output_specs)(batch, seq_len)
        return max((math.prod(s.shape) for s in specs), default=0)

    def boundary_shapes(self, batch: int, seq_len: int) -> dict[str, tuple[int, ...]]:
        """Shapes of what this stage sends on (its outputs), by name."""
        return {s.name: s.shape for s in self.output_specs(batch, seq_len)}

    # -- compute --------------------------------------------------------------------

    @property
    def needs_input_ids(self) -> bool:
        """Whether :meth:`forward` needs ``input_ids=`` on every stage (a padded encoder's mask)."""
        return self._fam.needs_input_ids

    def forward(self, *inputs: Tensor, input_ids: Tensor | None = None) -> tuple[Tensor, ...]:
        """``input_ids``: the micro-batch's token ids, read locally by a stage past the first
        when its family builds a padding mask from them (:attr:`needs_input_ids`)."""
        if len(inputs) != len(self.input_names):
            raise ValueError(f"stage {self.index} takes {len(self.input_names)} inputs "
                             f"{self.input_names}, got {len(inputs)}")
        fam = self._fam
        if self.index == 0:
            h = fam.embed(self, inputs[0])
            ref = h
        elif self.post_block is not None:
            a, ref = inputs
            h = None
        else:
            h = ref = inputs[0]
        if self.index == 0 and input_ids is None:
            input_ids = inputs[0]
        ctx = fam.context(self, ref, input_ids) if (self.blocks or self.pre_block is not None) else {}
        if self.post_block is not None:
            h = fam.post(self, self.post_part, a, ref)
        for layer in self.block_modules:
            h = fam.block(layer, h, ctx)
        if self.pre_block is not None:
            return fam.pre(self, self.pre_part, h, ctx)
        if self.index == self.num_stages - 1:
            return (fam.head(self, h, input_ids),)
        return (h,)

    def extra_repr(self) -> str:
        return (f"index={self.index}/{self.num_stages}, cut={self.cut!r}, post_block={self.post_block}, "
                f"blocks={list(self.blocks)}, pre_block={self.pre_block}")


def max_stages(num_blocks: int, cut: str = "block") -> int:
    """Most stages a model with ``num_blocks`` blocks can be cut into."""
    _check_cut(cut)
    return num_blocks if cut == "block" else num_blocks + 1


def _check_cut(cut: str) -> None:
    if cut not in CUTS:
        raise ValueError(f"unknown cut {cut!r}; choose from {', '.join(CUTS)}")


def _cut_range(num_blocks: int, cut: str) -> tuple[int, int]:
    """Allowed boundary values: a block cut c sits before block c; an ffn_act cut inside block c."""
    return (1, num_blocks - 1) if cut == "block" else (0, num_blocks - 1)


def default_boundaries(num_blocks: int, num_stages: int, cut: str = "block") -> list[int]:
    """Cuts as even as possible: near the quantiles num_blocks · m / num_stages.

    An ffn_act cut in block j leaves about j + 2/3 blocks before it (attention
    and the first FFN matrix), so its targets are shifted by 2/3 (for 12 blocks
    and 2 stages this gives block 5, the sixth block, as in the SparQ paper).
    """
    _check_stages(num_blocks, num_stages, cut)
    lo, hi = _cut_range(num_blocks, cut)
    shift = 0.0 if cut == "block" else 2.0 / 3.0
    k = num_stages - 1
    cuts = [math.floor(num_blocks * m / num_stages - shift + 0.5) for m in range(1, num_stages)]
    for i in range(k):  # clamp so that strictly increasing cuts fit in [lo, hi]
        cuts[i] = min(max(cuts[i], lo + i, cuts[i - 1] + 1 if i else lo), hi - (k - 1 - i))
    return cuts


def _check_stages(num_blocks: int, num_stages: int, cut: str) -> None:
    _check_cut(cut)
    if not isinstance(num_stages, int) or isinstance(num_stages, bool) or num_stages < 1:
        raise ValueError(f"num_stages must be an int >= 1, got {num_stages!r}")
    most = max_stages(num_blocks, cut)
    if num_stages > most:
        raise ValueError(f"cannot cut {num_blocks} blocks into {num_stages} stages with cut={cut!r} "
                         f"(at most {most})")


def _plans(num_blocks: int, num_stages: int, cut: str,
           boundaries: Sequence[int] | None) -> list[_Plan]:
    _check_stages(num_blocks, num_stages, cut)
    if boundaries is None:
        cuts = default_boundaries(num_blocks, num_stages, cut)
    else:
        cuts = list(boundaries)
        if len(cuts) != num_stages - 1:
            raise ValueError(f"{num_stages} stages need {num_stages - 1} boundaries, got {len(cuts)}")
        lo, hi = _cut_range(num_blocks, cut)
        for c in cuts:
            if not isinstance(c, int) or isinstance(c, bool) or not lo <= c <= hi:
                raise ValueError(f"boundary {c!r} out of range: {cut} cuts must be ints in [{lo}, {hi}]")
        if any(b <= a for a, b in itertools.pairwise(cuts)):
            raise ValueError(f"boundaries {cuts} must be strictly increasing")
    bounds = tuple(cuts)
    plans = []
    for m in range(num_stages):
        if cut == "block":
            start = 0 if m == 0 else cuts[m - 1]
            end = num_blocks if m == num_stages - 1 else cuts[m]
            plans.append(_Plan(m, num_stages, cut, None, tuple(range(start, end)), None, bounds))
        else:
            post = None if m == 0 else cuts[m - 1]
            pre = None if m == num_stages - 1 else cuts[m]
            start = 0 if post is None else post + 1
            end = num_blocks if pre is None else pre
            plans.append(_Plan(m, num_stages, cut, post, tuple(range(start, end)), pre, bounds))
    return plans


def _global_ids(model: nn.Module) -> dict[int, tuple[int, str]]:
    return {id(p): (i, n) for i, (n, p) in enumerate(model.named_parameters())}


def split_model(model: Any, num_stages: int, cut: str = "block",
                boundaries: Sequence[int] | None = None) -> list[Stage]:
    """Split ``model`` into ``num_stages`` consecutive stages that share its parameters.

    ``boundaries`` gives the block index of each cut (``num_stages - 1`` of
    them, strictly increasing): for ``cut="block"`` a cut ``c`` in
    ``[1, N-1]`` sits between blocks ``c-1`` and ``c``; for ``cut="ffn_act"`` a
    cut ``c`` in ``[0, N-1]`` sits in block ``c`` right after its FFN
    activation.  Default: :func:`default_boundaries`.
    """
    fam = _FAMILIES[_family_of(model.config)]
    num_blocks = len(fam.layers(model))
    ids = _global_ids(model)
    return [Stage(model, plan, ids) for plan in _plans(num_blocks, num_stages, cut, boundaries)]


def build_stage(name: str, *, seed: int, num_stages: int, stage_index: int, cut: str = "block",
                boundaries: Sequence[int] | None = None, dtype: torch.dtype = torch.float32,
                weights: str | None = None, device: torch.device | str = "cpu") -> Stage:
    """Build only stage ``stage_index`` of preset ``name`` split into ``num_stages``.

    The model skeleton is created on the meta device and only this stage's
    parameters are allocated, so a rank never holds more than its stage.  The
    values equal those of the same stage of ``build_model`` + ``split_model``.
    """
    preset = _preset(name)
    _check_stages(preset.num_blocks, num_stages, cut)
    if not isinstance(stage_index, int) or isinstance(stage_index, bool) \
            or not 0 <= stage_index < num_stages:
        raise ValueError(f"stage_index must be in [0, {num_stages - 1}], got {stage_index!r}")
    if weights is not None or preset.pretrained is not None:
        model = build_model(name, seed=seed, dtype=dtype, weights=weights, device=device)
        return split_model(model, num_stages, cut, boundaries)[stage_index]
    model = _meta_model(preset.hf_config())
    stage = split_model(model, num_stages, cut, boundaries)[stage_index]
    del model
    _materialise(stage, stage._entries, seed, preset.num_blocks, dtype, device)
    return stage


# --------------------------------------------------------------------------- info


def model_info(name: str) -> dict[str, Any]:
    """Parameter counts of preset ``name`` (computed on the meta device, nothing allocated)."""
    preset = _preset(name)
    model = _meta_model(preset.hf_config())
    fam = _FAMILIES[preset.family]
    total = sum(p.numel() for p in model.parameters())
    blocks = [sum(p.numel() for p in layer.parameters()) for layer in fam.layers(model)]
    embed = sum(p.numel() for m in fam.embed_modules(model).values() for p in m.parameters())
    head = sum(p.numel() for m in fam.head_modules(model).values() for p in m.parameters())
    layer0 = fam.layers(model)[0]
    pre = sum(p.numel() for m in fam.pre_modules(layer0).values() for p in m.parameters())
    return {
        "name": name,
        **asdict(preset),
        "num_parameters": total,
        "num_tensors": len(list(model.parameters())),
        "embedding_parameters": embed,
        "head_parameters": head,
        "block_parameters": blocks,
        "block_pre_ffn_act_parameters": pre,
        "ffn_act_width": fam.ffn_width(model.config),
        "fp32_bytes": 4 * total,
    }
