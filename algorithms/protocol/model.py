"""The subspace-constrained model: which tensors live in ``S`` and how the embedding splits.

Works on a whole Hugging Face model (``harness.models.build_model``) or on one
pipeline stage (``build_stage``); tensors are found by their *global* names, so
both views constrain exactly the same parameters (spec §2.2):

* every block before the last stage: the attention output projection and the
  MLP down projection, weight and bias (their ``d``-axis: the output axis);
* the token embedding, which becomes the trainable table ``T_S`` (rows in
  ``S``); a frozen high-rank ``T_fixed[ids]`` is added by a forward hook;
* a learned position table likewise (GPT-2, OPT): ``PE_fixed[:n]`` plus a
  trainable part in ``S``.  Llama's RoPE puts no positions in the stream.

The blocks of the last stage, Q/K/V, the up / gate projections, the norms and
the head stay free.  The tensors' names come from the family descriptions
(``harness.models.FamilySpec``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from harness.models import FAMILY_SPECS, PRESETS, FamilySpec, default_boundaries

from .params import WP2_OPTIMIZERS  # noqa: E402,F401  (re-exported)
from .subspace import SubspaceAdamW, Wire, off_subspace, project_


def residual_problem(model: str) -> str | None:
    """Why ``model`` cannot be subspace-constrained (None when it can)."""
    if model not in PRESETS:
        return (f"model {model!r} has no residual transformer blocks; protocol needs a pre-norm "
                f"residual transformer preset ({', '.join(PRESETS)})")
    if PRESETS[model].family not in FAMILY_SPECS:
        return f"model family {PRESETS[model].family!r} is not supported"
    return None


def first_free_block(num_blocks: int, num_stages: int) -> int:
    """Blocks ``0 .. first_free_block - 1`` sit on stages ``0 .. S-2`` and are constrained."""
    if num_stages < 2:
        raise ValueError("a protocol pipeline needs at least 2 stages")
    return default_boundaries(num_blocks, num_stages, "block")[-1]


def tables(spec: FamilySpec) -> tuple[str, str | None]:
    """Global names of the token table and of the learned position table (None with RoPE)."""
    pos = spec.position_embedding
    return f"{spec.token_embedding}.weight", None if pos is None else f"{pos}.weight"


def constrained_names(spec: FamilySpec, constrained_blocks: int) -> dict[str, tuple[int, bool]]:
    """Global name -> (d-axis, is MLP down projection) of every tensor kept in ``S``: the
    tables (width on axis 1) and, in blocks ``0 .. constrained_blocks - 1``, the two
    projections that write into the residual stream, weight and bias where there is one."""
    token, pos = tables(spec)
    wanted = {token: (1, False)}
    if pos is not None:
        wanted[pos] = (1, False)
    for i in range(constrained_blocks):
        for path, down in ((spec.attn_out, False), (spec.ffn_out, True)):
            wanted[f"{spec.block(i)}.{path}.weight"] = (spec.out_axis, down)
            wanted[f"{spec.block(i)}.{path}.bias"] = (0, down)
    return wanted


@dataclass
class Constraint:
    name: str
    param: nn.Parameter
    axis: int  # the model-width axis, projected onto S
    down: bool  # MLP down projection (row-constant AdamW)


def _family(module: nn.Module) -> FamilySpec:
    fam = getattr(getattr(module, "config", None), "model_type", None)
    if fam not in FAMILY_SPECS:
        raise ValueError(f"{type(module).__name__} is not a residual transformer of a supported family "
                         f"({', '.join(FAMILY_SPECS)}); protocol needs residual blocks")
    if fam == "opt" and not module.config.do_layer_norm_before:
        raise ValueError("post-LN OPT writes a norm into the residual stream; protocol needs pre-norm blocks")
    return FAMILY_SPECS[fam]


def _global_params(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    if hasattr(module, "global_named_parameters"):  # a harness Stage
        return [(n, p) for _, n, p in module.global_named_parameters()]
    return list(module.named_parameters())


def _owner(module: nn.Module, param: nn.Parameter) -> nn.Module:
    return next(m for m in module.modules() if getattr(m, "weight", None) is param)


class ConstrainedModel:
    """The constrained tensors of a model or stage, the hooks that add the fixed tables,
    and the projections that keep them in ``S`` (``wire.U``, which Grassmann updates change)."""

    def __init__(self, module: nn.Module, wire: Wire, constrained_blocks: int):
        spec = _family(module)
        self.module, self.wire = module, wire
        token, pos = tables(spec)
        wanted = constrained_names(spec, constrained_blocks)
        params = dict(_global_params(module))
        self.constraints = [Constraint(n, params[n], *wanted[n]) for n in params if n in wanted]
        self._hooks = []
        if token in params:
            emb = _owner(module, params[token])
            self._hooks.append(emb.register_forward_hook(lambda m, args, out: out + self.wire.t_fixed[args[0]]))
        if pos is not None and pos in params:
            if wire.pe_fixed is None:
                raise ValueError(f"{spec.name} has learned positions: the wire needs a fixed position table")
            emb = _owner(module, params[pos])
            self._hooks.append(emb.register_forward_hook(
                lambda m, args, out: out + self.wire.pe_fixed[: out.shape[-2]]))
        self.project()

    # -- the subspace invariant ---------------------------------------------------------
    def project(self) -> None:
        for c in self.constraints:
            project_(c.param.data, self.wire.U, c.axis)

    def project_grads(self) -> None:
        for c in self.constraints:
            if c.param.grad is not None:
                project_(c.param.grad, self.wire.U, c.axis)

    def project_moments(self, opt: torch.optim.Optimizer) -> None:
        for c in self.constraints:
            st = opt.state.get(c.param)
            if st:
                project_(st["exp_avg"], self.wire.U, c.axis)

    def distance(self) -> float:
        """Largest relative off-subspace part of any constrained tensor (0 if none)."""
        return max((off_subspace(c.param.data, self.wire.U, c.axis) for c in self.constraints), default=0.0)

    def is_constrained(self, param: nn.Parameter) -> Constraint | None:
        return next((c for c in self.constraints if c.param is param), None)

    # -- the optimiser --------------------------------------------------------------------
    def optimizer(self, p) -> SubspaceAdamW:
        """AdamW; down projections with the row-constant second moment (``p.wp2_optimizer``)."""
        rowconst = p.wp2_optimizer == "rowconst_adamw"
        down = {id(c.param): c.axis for c in self.constraints if c.down}
        groups: list[dict] = []
        for _, w in _global_params(self.module):  # global order: the same on any split
            axis = down.get(id(w)) if rowconst else None
            groups.append({"params": [w], "row_axis": axis})
        return SubspaceAdamW(groups, lr=p.lr, betas=(p.beta1, p.beta2), eps=p.eps,
                             weight_decay=p.weight_decay)
