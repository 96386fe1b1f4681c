"""Value residual learning (ResFormer; Zhou et al., 2024, arXiv 2410.17897).

Every self-attention after the first mixes the values it projects with the first block's:

    U_n = A_n (lambda_1 V_n + lambda_2 V_1),   V_n = H_n W_V,n

``fixed``: lambda_1 = lambda_2 = 0.5, the paper's Eq. 7 (first version; its official code mixes
the values before the head split, the same as here since the mix is per element).
``learnable``: a (lambda_1, lambda_2) pair per block, initialised to 0.5 / 0.5 (the fixed mix:
the two variants start as the same model; the paper's later versions study learnable lambdas
without fixing their start, so this start is ours).

The first block's values V_1 are computed at every call for that call's positions; a block's
attention cache holds its *mixed* values, so incremental decoding computes what a full forward
does (tested). Unlike the other depth connections, the model with value residual is *not* the
plain model at initialisation (the paper's method has no identity setting; ``learnable``
with lambdas (1, 0) is, exactly).
"""
from dataclasses import dataclass
import logging
from typing import Callable, Dict, Optional

import torch
from torch import Tensor, nn

from fairseq.dataclass import FairseqDataclass

from ..config import option
from ..weight_logging import WeightSource
from .interface import StackState
from .registry import VALUE_HOOK, VALUES, Method, Stack

KINDS = ("none", "fixed", "learnable")
logger = logging.getLogger(__name__)


@dataclass
class ValueResidualConfig(FairseqDataclass):
    """Flag ``--value-residual``; hydra ``model.value_residual``."""
    value_residual: Optional[str] = option(
        "none", "value residual (ResFormer, Zhou et al. 2024): every self-attention after the "
                "first mixes its values with the first block's; fixed 0.5/0.5 or learnable "
                "per block", choices=KINDS)


PRESETS = {"value_residual": {"value_residual": "learnable"}}  # <family>_<name>_tiny
CONFIG = ValueResidualConfig
FLAG = "--value-residual"  # the option that turns the method on (its errors name it)
CHECKPOINT_NAMES = {"value_residual": FLAG}  # what a mismatched checkpoint is named by


def active(args) -> bool:
    return (getattr(args, "value_residual", None) or "none") != "none"


def build(args, stack: Stack) -> "ValueResidual":
    return ValueResidual(len(stack.layout), learnable=args.value_residual == "learnable")


METHOD = Method("value_residual", FLAG, CONFIG, active, build, PRESETS, role=VALUES,
                needs=lambda args: frozenset({VALUE_HOOK}), checkpoint_names=CHECKPOINT_NAMES)


class ValueResidual(WeightSource, nn.Module):
    """``lambdas``: num_blocks x 2 (row n: block n's (lambda_1, lambda_2); row 0 unused), a
    parameter when learnable, else a buffer of 0.5; ``variant``: 0 fixed, 1 learnable. Both go
    into the checkpoint, so that a checkpoint says it was trained with value residual, and which
    (:meth:`upgrade_state_dict_named`)."""

    def __init__(self, num_blocks: int, learnable: bool):
        super().__init__()
        self.learnable = learnable
        lambdas = torch.full((num_blocks, 2), 0.5)
        if learnable:
            self.lambdas = nn.Parameter(lambdas)
        else:
            self.register_buffer("lambdas", lambdas)
        self.register_buffer("variant", torch.tensor(int(learnable)))

    def upgrade_state_dict_named(self, state_dict, name):
        """Checkpoints saved before the variant was stored: a learnable one (its lambdas, no
        variant) gets its variant; one without any value-residual entry, loaded into a fixed
        model, is read as a fixed checkpoint of that time (fixed stored nothing then; a plain
        model's checkpoint looks the same, and one log line says so). A fixed checkpoint
        continues in a learnable model (the lambdas start at its 0.5 / 0.5: the same function,
        one log line); a learnable one in a fixed model is refused (the fixed mix would replace
        its learned lambdas). A model without value residual refuses a checkpoint with it
        (``checkpoint_names``), fixed or learnable."""
        prefix = f"{name}." if name else ""
        lambdas, variant = f"{prefix}lambdas", f"{prefix}variant"
        if variant not in state_dict:
            if lambdas in state_dict:  # learnable, saved before the variant was stored
                state_dict[variant] = torch.tensor(1)
            elif not self.learnable:
                state_dict[lambdas] = self.lambdas.detach().clone()
                state_dict[variant] = self.variant.clone()
                logger.info(f"{name}: the checkpoint has no value-residual entries: read as a "
                            "--value-residual fixed checkpoint saved before they were stored "
                            "(a plain model's checkpoint looks the same; with value residual it "
                            "computes another function)")
                return
            else:
                return  # nothing to continue from: refused by name by the strict load
        stored = int(state_dict[variant])
        if stored == int(self.variant):
            return
        if self.learnable:
            state_dict[variant] = self.variant.clone()
            logger.info(f"{name}: a --value-residual fixed checkpoint continues with learnable "
                        "lambdas, from its 0.5 / 0.5")
            return
        raise ValueError("the checkpoint's value residual was trained with --value-residual "
                         "learnable, this model has --value-residual fixed (which would replace "
                         "the learned lambdas by 0.5): use --value-residual learnable")

    def new_slot(self, x: Tensor) -> "_FirstValues":
        return _FirstValues()

    def mix(self, state: StackState, block: int) -> Callable[[Tensor], Tensor]:
        """What block ``block``'s self-attention applies to its values (B x H x T x hp): the
        first block keeps them as V_1 (in this pass's slot); later blocks mix."""
        first = state.slot(self)
        if block == 0:
            def keep(values: Tensor) -> Tensor:
                first.values = values
                return values
            return keep

        def mix(values: Tensor) -> Tensor:
            if first.values is None:
                raise RuntimeError("value residual: the first block's self-attention did not run")
            lam = self.lambdas[block].to(values.dtype)
            return lam[0] * values + lam[1] * first.values
        return mix

    def logged_weights(self) -> Dict[str, Tensor]:
        """{'b<n>_lambda<k>': block n's lambda_k} (constant 0.5 when fixed)."""
        lambdas = self.lambdas.detach().float()
        return {f"b{n}_lambda{k + 1}": lambdas[n, k] for n in range(1, lambdas.size(0))
                for k in range(2)}

    @staticmethod
    def macs(embed_dim: int, num_blocks: int) -> int:
        """Per token: two scaled vectors per block after the first."""
        return 2 * embed_dim * max(num_blocks - 1, 0)

    def extra_repr(self) -> str:
        return f"{'learnable' if self.learnable else 'fixed 0.5/0.5'}, blocks={self.lambdas.size(0)}"


class _FirstValues:
    """Value residual's slot: the first block's self-attention values of this pass's
    positions (B x H x T x hp; None until it ran)."""
    __slots__ = ("values",)

    def __init__(self):
        self.values: Optional[Tensor] = None
