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
import functools
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence

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


# what a source hands the statistics of one pass to: {name: scalar tensor, detached}
Record = Callable[[Dict[str, Tensor]], None]


class WeightSource:
    """A module that offers weights to ``--log-layer-weights`` (a base beside ``nn.Module``):
    its parameters' through :meth:`logged_weights`, the statistics of a pass (mean attention
    weights, the Amax gain) by handing them, at the end of the pass, to the ``record`` it was
    given by :meth:`start_logging`. Nothing of a pass is kept on the module."""

    def logged_weights(self) -> Dict[str, Tensor]:
        """{name: scalar tensor, detached}: what the parameters say now."""
        return {}

    def start_logging(self, record: Record):
        """From now on, hand ``record`` the statistics of every pass that has them (each
        source says which passes: the training ones, or every one); called once, by the model
        that logs or by the layer analysis. A source whose weights are all parameters has
        nothing to start."""


def _keep(store: Dict[str, Dict[str, Tensor]], path: str, values: Dict[str, Tensor]):
    store.setdefault(path, {}).update(values)


def start_recording(found: Dict[str, WeightSource]) -> Dict[str, Dict[str, Tensor]]:
    """Start every source of ``found`` ({module path: source}); returns the store the
    statistics of the passes go to: {module path: {name: value}}, overwritten by each pass
    (the caller clears it where it wants one pass's only)."""
    store: Dict[str, Dict[str, Tensor]] = {}
    for path, module in found.items():
        module.start_logging(functools.partial(_keep, store, path))
    return store


def sources(model: nn.Module) -> Dict[str, WeightSource]:
    """{module path: module} of every sub-module that is a :class:`WeightSource`."""
    return {name: module for name, module in model.named_modules()
            if isinstance(module, WeightSource)}


def collect(found: Dict[str, nn.Module],
            passed: Optional[Dict[str, Dict[str, Tensor]]] = None) -> Dict[str, Tensor]:
    """{metric name: scalar tensor} of the weights of ``found`` (:func:`sources`) now, and of
    the statistics of the pass in ``passed`` (:func:`start_recording`'s store)."""
    out = {}
    for path, module in found.items():
        for key, value in reported(path, module, passed).items():
            out[f"{PREFIX}{path.replace('.', '_')}_{key}"] = value
    return out


def reported(path: str, module: WeightSource,
             passed: Optional[Dict[str, Dict[str, Tensor]]] = None) -> Dict[str, Tensor]:
    """What the source ``module`` (at ``path`` in its model) reports: its parameters' weights
    and the statistics of the pass in ``passed`` (:func:`start_recording`'s store)."""
    return {**module.logged_weights(), **(passed or {}).get(path, {})}


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
        self.layer_weight_sources = found
        self.layer_weights_of_the_pass = start_recording(found)
        self.log_layer_weights = True

    def forward(self, *args, **kwargs):
        """The model's forward; with ``--log-layer-weights``, a training pass logs the weights."""
        if self.log_layer_weights:
            self.layer_weights_of_the_pass.clear()  # this pass's statistics only
        out = super().forward(*args, **kwargs)
        if self.training and self.log_layer_weights:
            for name, value in collect(self.layer_weight_sources,
                                       self.layer_weights_of_the_pass).items():
                metrics.log_scalar(name, value, weight=1, round=5)
        return out
