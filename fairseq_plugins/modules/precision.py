"""What the package's custom kernels need to know about reduced precision.

Two facts, each decided here once:

- :func:`autocast_inputs`: a custom ``torch.autograd.Function`` is not seen by autocast, so its
  forward would mix a half-precision activation with a float32 parameter and its backward would
  receive gradients of a dtype its saved tensors do not have. Casting the inputs to autocast's
  dtype for the device first (what autocast does to a matmul's inputs; the equivalent of
  ``torch.amp.custom_fwd(cast_inputs=...)`` for whichever device the tensors are on) makes the
  forward and the backward run in one dtype; autograd casts each input's gradient back to that
  input's own dtype.
- :func:`cpu_tuned`: the paths that pad tensor widths for CPU kernels (the tied output
  projection's weight gradient, attention head dims of the language models) were measured to
  help on the CPU in float32 (``scripts/bench``). They run on the CPU in full precision (float32,
  and float64, where the tests check them exactly) without autocast. Everywhere else (CUDA,
  float16/bfloat16, autocast) the plain torch op runs: there, padding is an unmeasured cost,
  not a known gain. Callers look the function up as ``precision.cpu_tuned`` so that tests can
  force the plain path and compare both.
"""
from typing import Tuple

import torch
from torch import Tensor


def autocast_inputs(*tensors: Tensor) -> Tuple[Tensor, ...]:
    """The floating-point ``tensors`` cast to autocast's dtype when autocast is on for their
    device; unchanged otherwise."""
    device = tensors[0].device.type
    if not torch.is_autocast_enabled(device):
        return tensors
    dtype = torch.get_autocast_dtype(device)
    return tuple(t.to(dtype) if t.is_floating_point() else t for t in tensors)


def cpu_tuned(tensor: Tensor) -> bool:
    """True where the CPU-tuned (padded) paths run: ``tensor`` (an input or a parameter of the
    op) is float32 or float64 on the CPU and autocast is off there."""
    return (tensor.device.type == "cpu" and tensor.dtype in (torch.float32, torch.float64)
            and not torch.is_autocast_enabled("cpu"))
