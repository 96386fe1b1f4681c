"""``--log-layer-weights``: each method's own layer weights logged while training.

Every module of this package that combines layers offers its weights one way: it is a
:class:`WeightSource` (``logged_weights() -> Dict[str, Tensor]``, scalars, detached): the DWA
alphas, the FC bridge's block norms, transparent attention's weights, the depth connections'
static weights, fuse-attention's mean weight per (layer, state) pair over the tokens of the last
training pass. A model finds its sources by that type once, at build time, and calls
:meth:`WeightSource.start_logging` on each. With the option on, a model logs them with
fairseq's metrics after each training forward pass, as ``lw_<module path>_<name>``; fairseq
averages them over the ``--log-interval`` like its own training statistics and writes them to
TensorBoard (``--tensorboard-logdir``), to the progress bar and to the JSON log. Off by default:
nothing is computed. The values are those of the process that logs (rank 0 in distributed
training): parameters are the same on every rank, fuse-attention means are rank 0's batches.
"""
from dataclasses import dataclass
from typing import Dict, Optional, Sequence

from torch import Tensor, nn

from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics

from .config import option

PREFIX = "lw_"


@dataclass
class WeightLoggingConfig(FairseqDataclass):
    log_layer_weights: Optional[bool] = option(
        False, "log each layer-combining method's own weights (DWA alphas, fuse-attention per "
               "layer pair, bridge / transparent weights) every --log-interval updates, e.g. to "
               "TensorBoard with --tensorboard-logdir")


class WeightSource:
    """A module that offers weights to ``--log-layer-weights`` (a base beside ``nn.Module``)."""

    def logged_weights(self) -> Dict[str, Tensor]:
        """{name: scalar tensor, detached}: the weights now (statistics of a training pass: of
        the last one, once :meth:`start_logging` was called; none before one)."""
        raise NotImplementedError

    def start_logging(self):
        """From now on a training pass also computes the statistics of the pass that
        :meth:`logged_weights` reports (called once, when the model starts logging); a source
        whose weights are parameters has nothing to start."""


def sources(model: nn.Module) -> Dict[str, WeightSource]:
    """{module path: module} of every sub-module that is a :class:`WeightSource`."""
    return {name: module for name, module in model.named_modules()
            if isinstance(module, WeightSource)}


def collect(found: Dict[str, nn.Module]) -> Dict[str, Tensor]:
    """{metric name: scalar tensor} of the weights of ``found`` (:func:`sources`) now."""
    out = {}
    for path, module in found.items():
        for key, value in module.logged_weights().items():
            out[f"{PREFIX}{path.replace('.', '_')}_{key}"] = value
    return out


class LogsLayerWeights:
    """What a model of this package needs for ``--log-layer-weights`` (put it before the fairseq
    model class among the bases): its build calls :meth:`start_logging_layer_weights` when the
    option is on, and every training forward pass then logs the weights with fairseq's metrics.
    The sources are found once, at build time (they do not change)."""

    log_layer_weights = False

    def start_logging_layer_weights(self, arch: str, offers: Sequence[str]):
        """Switch logging on for this model (built as ``arch``): the sources that keep something
        from the forward pass (fuse-attention's weights) start keeping it. A model without any
        source is an error naming ``offers``, the options of this model that would add one."""
        found = sources(self)
        if not found:
            raise ValueError(f"--log-layer-weights: {arch} has no layer-combining weights to log; "
                             f"switch on a method that has them: {', '.join(offers)}")
        for module in found.values():
            module.start_logging()
        self.layer_weight_sources = found
        self.log_layer_weights = True

    def forward(self, *args, **kwargs):
        """The model's forward; with ``--log-layer-weights``, a training pass logs the weights."""
        out = super().forward(*args, **kwargs)
        if self.training and self.log_layer_weights:
            for name, value in collect(self.layer_weight_sources).items():
                metrics.log_scalar(name, value, weight=1, round=5)
        return out
