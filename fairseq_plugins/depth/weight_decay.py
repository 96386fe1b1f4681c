"""No weight decay on the parameters of the depth connections.

fairseq's ``--weight-decay`` decays every tensor it trains, and its optimizers take the
parameters as one group. Connection weights are not ordinary weights: their initialisation is
the identity of the residual stack (DWA's alpha_{s,s} = 1, Hyper-Connections' A_r = I and B = 1,
MUDD's one-hot static weights, value residual's lambdas), and decaying them towards zero pulls
the stack away from it; in a Hyper-Connections user's run the static weights diverged to NaN
under weight decay, and the authors' advice was to exclude them. So they get none by default
(``--decay-depth-connections`` to decay them like the rest).

How, with every optimizer fairseq has: each such parameter carries fairseq's own per-parameter
override, ``optim_overrides = {"optimizer": {"weight_decay_scale": 0.0}}``, which fairseq's
``--optimizer composite`` honours itself and ``--fp16-no-flatten-grads`` copies onto its fp32
parameters. For the plain optimizers (one group), a pair of torch's optimizer step hooks
(:func:`torch.optim.optimizer.register_optimizer_step_pre_hook`) moves the marked parameters
into a group of their own with weight decay 0 just before each ``step()`` and back right after
it: the step is exactly that of two groups, and the optimizer's groups, its state dict and its
checkpoints stay as fairseq made them (resuming works unchanged). ``--fp16`` / ``--bf16`` flatten
all parameters into one tensor, which no group can split: with weight decay on, that is a
build-time error naming the flags that keep them apart.
"""
from dataclasses import dataclass
from typing import Iterable, Optional

import torch
from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                   register_optimizer_step_pre_hook)
from torch import nn

from fairseq.dataclass import FairseqDataclass

from ..config import from_config, option

OVERRIDE = {"optimizer": {"weight_decay_scale": 0.0}}
_hooks = []  # the registered pair (registered once per process)


@dataclass
class WeightDecayConfig(FairseqDataclass):
    """Flag ``--decay-depth-connections`` and the settings it is checked against."""
    decay_depth_connections: Optional[bool] = option(
        False, "apply --weight-decay to the depth connections' own parameters too (DWA alphas, "
               "Hyper-Connections, MUDD static weights, value-residual lambdas); off: they get "
               "none")
    weight_decay: Optional[float] = from_config(
        "optimizer.weight_decay", "the optimizer's weight decay (checked at build time)")
    fp16: Optional[bool] = from_config("common.fp16", "fp16 training (flattened parameters)")
    bf16: Optional[bool] = from_config("common.bf16", "bf16 training (flattened parameters)")
    memory_efficient_fp16: Optional[bool] = from_config(
        "common.memory_efficient_fp16", "keeps the model's parameters")
    memory_efficient_bf16: Optional[bool] = from_config(
        "common.memory_efficient_bf16", "keeps the model's parameters")
    fp16_no_flatten_grads: Optional[bool] = from_config(
        "common.fp16_no_flatten_grads", "fp32 copies per parameter")


CONFIG = WeightDecayConfig


def excluded(param: torch.Tensor) -> bool:
    overrides = getattr(param, "optim_overrides", None) or {}
    return overrides.get("optimizer", {}).get("weight_decay_scale", 1.0) == 0.0


def exclude(args, params: Iterable[nn.Parameter]):
    """Mark ``params`` for no weight decay (unless ``--decay-depth-connections``); checked
    against the precision flags here, at build time."""
    params = list(params)
    if not params or getattr(args, "decay_depth_connections", False):
        return
    flattened = ((getattr(args, "fp16", False) or getattr(args, "bf16", False))
                 and not (getattr(args, "memory_efficient_fp16", False)
                          or getattr(args, "memory_efficient_bf16", False)
                          or getattr(args, "fp16_no_flatten_grads", False)))
    if flattened and (getattr(args, "weight_decay", 0.0) or 0.0) > 0:
        raise ValueError("--weight-decay with --fp16/--bf16 flattens every parameter into one "
                         "tensor, so the depth connections' parameters cannot be kept out of it: "
                         "add --fp16-no-flatten-grads (or --memory-efficient-fp16), or "
                         "--decay-depth-connections to decay them too")
    for p in params:
        p.optim_overrides = OVERRIDE
    _register_hooks()


def _register_hooks():
    if _hooks:
        return
    _hooks.append(register_optimizer_step_pre_hook(_split))
    _hooks.append(register_optimizer_step_post_hook(_merge))


def _split(optimizer, args, kwargs):
    """Before ``step()``: the marked parameters of every group with weight decay move into a
    group of their own (the same settings, weight decay 0), placed right after it."""
    moved = []
    for group in list(optimizer.param_groups):
        if group.get("weight_decay", 0) == 0 or group.get("_no_decay_of") is not None:
            continue
        marked = [p for p in group["params"] if excluded(p)]
        if not marked:
            continue
        ids = {id(p) for p in marked}
        order = list(group["params"])
        group["params"] = [p for p in order if id(p) not in ids]
        twin = {k: v for k, v in group.items() if k != "params"}
        twin.update(params=marked, weight_decay=0.0, _no_decay_of=id(group))
        moved.append((group, order, twin))
    for group, order, twin in moved:
        optimizer.param_groups.insert(optimizer.param_groups.index(group) + 1, twin)
        twin["_original_order"] = order


def _merge(optimizer, args, kwargs):
    """After ``step()``: every split group gets its parameters back, in their original order."""
    twins = [g for g in optimizer.param_groups if g.get("_no_decay_of") is not None]
    for twin in twins:
        optimizer.param_groups.remove(twin)
        group = next(g for g in optimizer.param_groups if id(g) == twin["_no_decay_of"])
        group["params"] = twin["_original_order"]
