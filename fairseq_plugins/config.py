"""Model options as dataclass fields, the same under both of fairseq's entry points.

fairseq builds a model from one of three things: the argparse ``Namespace`` of ``fairseq-train``
(and of in-process builds), the OmegaConf ``DictConfig`` of ``fairseq-hydra-train`` and of stored
checkpoints, or an instance of the model's dataclass. Each model of this package declares its
options once, as fields of a :class:`~fairseq.dataclass.FairseqDataclass` registered with
``register_model(name, dataclass=...)``, and its ``build_model`` starts with
:func:`model_args`, which turns whichever of the three it got into one ``Namespace`` and runs
the architecture (``--arch`` / ``model._name``) on it exactly as ``fairseq-train`` does. So a
preset means the same thing under both entry points, and no option is ever read with a plain
``getattr`` from a ``DictConfig`` (where a missing key would silently read as None or as the
caller's default; fairseq's own legacy presets have that defect, facebookresearch/fairseq#4675).

Conventions of the fields:

- :func:`option`: a model option. Its dataclass default is None, read as "not given": a preset
  (an architecture function) may set it, and the architecture's base fills in the documented
  default (``metadata["arch_default"]``). The flag (``--name-with-dashes``), its type, help
  and default text are derived from the field (:func:`add_flags`); ``choices``, ``minimum`` and
  ``maximum`` are checked at build time under every entry point (:func:`check`).
- :func:`from_config`: a value the model reads from another group of the configuration (the
  task's ``tokens_per_sample``, the criterion's name); an interpolation under hydra, the flag of
  that group under argparse.
- :func:`fairseq_fields`: fairseq's own transformer options, flattened as its flags are
  (``encoder_embed_dim``, ...), derived from fairseq's ``TransformerConfig`` (not written again);
  also None by default, fairseq's architecture functions fill them in.

After the build, the resolved values are written back into the configuration the model was
built from (:func:`record`), so that a checkpoint stores every option's actual value.
"""
import argparse
import dataclasses
import difflib
import inspect
import typing
from argparse import Namespace
from enum import Enum
from typing import Any, Callable, Dict, List, Optional, Type

from omegaconf import OmegaConf, open_dict
from omegaconf.errors import ConfigKeyError, InterpolationResolutionError, ValidationError

from fairseq.dataclass import FairseqDataclass
from fairseq.models import ARCH_CONFIG_REGISTRY

from .errors import OptionError

ARCH_DEFAULT = "arch_default"


class ConfigError(OptionError):
    """A model option that is unknown, of the wrong type or out of range (one line)."""


def option(default, help: str, *, choices=None, minimum=None, maximum=None, metavar=None,
           default_text: Optional[str] = None):
    """A model option whose documented default is ``default`` (see the module doc)."""
    return dataclasses.field(default=None, metadata={
        "help": help, ARCH_DEFAULT: default, "choices": tuple(choices) if choices else None,
        "min": minimum, "max": maximum, "metavar": metavar, "default_text": default_text})


def from_config(path: str, help: str):
    """A value read from ``path`` of the whole configuration (None where it has none)."""
    return dataclasses.field(default=f"${{oc.select:{path},null}}",
                             metadata={"help": help, "from_config": path})


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def both_spellings(name: str) -> str:
    """``--name (model.name under hydra)``: a model option as both entry points spell it."""
    return f"{flag(name)} (model.{name} under hydra)"


def _error(name: str, what: str) -> "ConfigError":
    """``--name what (model.name under hydra)``: the option as both entry points spell it."""
    return ConfigError(f"{flag(name)} {what} (model.{name} under hydra)")


def _inner_type(annotation):
    """Optional[X] -> X."""
    if typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def _option_fields(dc) -> List[dataclasses.Field]:
    return [f for f in dataclasses.fields(dc) if ARCH_DEFAULT in f.metadata]


# -- fairseq's transformer options, flattened ------------------------------------------------------
# value ranges of fairseq's own options (fairseq checks none of them before building)
FAIRSEQ_RANGES = {
    "dropout": (0.0, 1.0), "attention_dropout": (0.0, 1.0), "activation_dropout": (0.0, 1.0),
    "relu_dropout": (0.0, 1.0), "adaptive_softmax_dropout": (0.0, 1.0),
    "encoder_layerdrop": (0.0, 1.0), "decoder_layerdrop": (0.0, 1.0),
    "encoder_embed_dim": (1, None), "decoder_embed_dim": (1, None),
    "encoder_ffn_embed_dim": (1, None), "decoder_ffn_embed_dim": (1, None),
    "encoder_layers": (1, None), "decoder_layers": (1, None),
    "encoder_attention_heads": (1, None), "decoder_attention_heads": (1, None),
    "decoder_input_dim": (1, None), "decoder_output_dim": (1, None),
    "max_source_positions": (1, None), "max_target_positions": (1, None),
    "quant_noise_pq": (0.0, 1.0), "quant_noise_scalar": (0.0, 1.0),
}


# fairseq's activation_fn enum lists fewer than utils.get_activation_fn implements (and its own
# presets, opus-mt's swish here, use)
FAIRSEQ_CHOICES = {"activation_fn": ("relu", "relu_squared", "gelu", "gelu_fast",
                                     "gelu_accurate", "tanh", "linear", "swish")}


# options that fairseq itself reads from the model's configuration (the trainer: base_layers,
# with getattr(cfg.model, "base_layers", 0) > 0): they keep fairseq's default, which no
# architecture function changes, instead of None
FAIRSEQ_READ_OUTSIDE_THE_MODEL = ("base_layers",)


def fairseq_fields(config_class, prefix: str = "") -> List[tuple]:
    """(name, type, field) of every option of a fairseq model dataclass, nested ones flattened
    with their prefix (``encoder.embed_dim`` -> ``encoder_embed_dim``), as fairseq's flags are.
    Every one defaults to None (fairseq's architecture functions fill them in) but those of
    ``FAIRSEQ_READ_OUTSIDE_THE_MODEL``; choices become strings with their allowed values."""
    out = []
    for f in dataclasses.fields(config_class):
        if f.name.startswith("_"):
            continue
        kind = _inner_type(f.type)
        if inspect.isclass(kind) and issubclass(kind, FairseqDataclass):
            out += fairseq_fields(kind, f"{prefix}{f.name}_")
            continue
        name = prefix + f.name
        choices = None
        if inspect.isclass(kind) and issubclass(kind, Enum):
            choices, kind = FAIRSEQ_CHOICES.get(name, tuple(c.value for c in kind)), str
        low, high = FAIRSEQ_RANGES.get(name, (None, None))
        metadata = {"help": f.metadata.get("help"), "choices": choices, "min": low, "max": high,
                    "fairseq": True}
        default = f.default if name in FAIRSEQ_READ_OUTSIDE_THE_MODEL else None
        out.append((name, Optional[kind], dataclasses.field(default=default, metadata=metadata)))
    return out


def flat_dataclass(name: str, config_class) -> type:
    """A dataclass of fairseq's ``config_class`` options, flattened (see :func:`fairseq_fields`)."""
    return dataclasses.make_dataclass(name, fairseq_fields(config_class), bases=(FairseqDataclass,))


# -- flags -----------------------------------------------------------------------------------------
def _default_text(f: dataclasses.Field) -> str:
    if f.metadata.get("default_text"):
        return f.metadata["default_text"]
    value = f.metadata[ARCH_DEFAULT]
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else str(value)


def add_flags(parser, dc):
    """The argparse flags of ``dc``'s :func:`option` fields: booleans as ``--x/--no-x``, choices,
    types from the annotations, help ending in the default. No argparse default: an option not
    given stays unset, so that a preset can set it (fairseq's model groups suppress defaults)."""
    for f in _option_fields(dc):
        kind = _inner_type(f.type)
        kwargs = {"help": f"{f.metadata['help']} (default: {_default_text(f)})"}
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = kind
            if f.metadata["choices"]:
                kwargs["choices"] = f.metadata["choices"]
            elif f.metadata["metavar"]:
                kwargs["metavar"] = f.metadata["metavar"]
        parser.add_argument(flag(f.name), **kwargs)


def set_defaults(args, dc):
    """Every :func:`option` of ``dc`` not set on ``args`` gets its documented default."""
    for f in _option_fields(dc):
        if getattr(args, f.name, None) is None:
            setattr(args, f.name, f.metadata[ARCH_DEFAULT])


# -- from any configuration to one Namespace ------------------------------------------------------
def _plain(value):
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _config_error(error, dc, arch) -> ConfigError:
    key = getattr(error, "key", None) or "?"
    if isinstance(error, ConfigKeyError):
        known = [f.name for f in dataclasses.fields(dc) if not f.name.startswith("_")]
        close = difflib.get_close_matches(str(key), known, n=1)
        hint = f"; did you mean model.{close[0]}?" if close else ""
        return ConfigError(f"model.{key}: no such option of {arch}{hint} (the options: "
                           f"`fairseq-train --arch {arch} --help`)")
    message = str(error).splitlines()[0]
    return ConfigError(f"model.{key}: {message}")


def _given(cfg, dc, arch) -> Dict[str, Any]:
    """The options given in ``cfg``: unknown keys and wrong types of a configuration are an
    error here; a field's None (and an interpolation with nothing to read) means not given."""
    fields = {f.name for f in dataclasses.fields(dc)}
    if isinstance(cfg, Namespace):
        return {k: v for k, v in vars(cfg).items() if v is not None or k not in fields}
    if dataclasses.is_dataclass(cfg):
        cfg = OmegaConf.structured(cfg)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(dc), cfg)
    except (ConfigKeyError, ValidationError) as e:
        raise _config_error(e, dc, arch) from None
    if cfg._get_parent() is not None:  # interpolations read the whole configuration
        merged._set_parent(cfg._get_parent())
    given = {}
    for key in merged:
        try:
            value = merged[key]
        except InterpolationResolutionError:
            continue  # e.g. ${task.tokens_per_sample} in a configuration without a task
        if value is not None and not key.startswith("_"):
            given[key] = _plain(value)
    return given


def arch_name(cfg, default: str) -> str:
    """The architecture a configuration asks for (``--arch`` or ``model._name``)."""
    name = getattr(cfg, "arch", None) if isinstance(cfg, Namespace) else None
    if OmegaConf.is_config(cfg):
        name = cfg.get("_name") or cfg.get("arch")
    elif dataclasses.is_dataclass(cfg):
        name = getattr(cfg, "_name", None)
    return name or default


def check(args: Namespace, dc):
    """Types, choices and ranges of every field of ``dc`` (raises :class:`ConfigError`)."""
    for f in dataclasses.fields(dc):
        value = getattr(args, f.name, None)
        if value is None or f.name.startswith("_") or "from_config" in f.metadata:
            continue
        kind = _inner_type(f.type)
        ok = (isinstance(value, kind) and not (kind is int and isinstance(value, bool))
              if kind in (bool, int, str) else
              isinstance(value, (int, float)) and not isinstance(value, bool)
              if kind is float else True)
        if not ok:
            raise _error(f.name, f"must be of type {kind.__name__}, got {value!r}")
        choices = f.metadata.get("choices")
        if choices and value not in choices:
            raise _error(f.name, f"must be one of {', '.join(map(str, choices))}, got {value!r}")
        low, high = f.metadata.get("min"), f.metadata.get("max")
        if (low is not None and value < low) or (high is not None and value > high):
            bounds = (f">= {low}" if high is None else f"<= {high}" if low is None
                      else f"in [{low}, {high}]")
            raise _error(f.name, f"must be {bounds}, got {value}")


def record(cfg, args: Namespace, dc):
    """Write the resolved values of ``dc``'s fields back into ``cfg`` (what a checkpoint
    stores), so that it says which model was built whatever the defaults become."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(dc)
              if not f.name.startswith("_") and getattr(args, f.name, None) is not None}
    if OmegaConf.is_config(cfg):
        with open_dict(cfg):
            for key, value in values.items():
                cfg[key] = value
    else:
        for key, value in values.items():
            setattr(cfg, key, value)


def architecture(fn: Callable[[Namespace], None]) -> Callable:
    """An architecture function (preset) that runs on Namespaces only. fairseq's
    ``build_model`` calls the ``--arch`` function on a hydra DictConfig before the model's own
    ``build_model`` (after merging the model's dataclass into it, every option None): filling
    defaults in there would make them look given. :func:`model_args` runs it on the Namespace
    it builds instead, where a missing option is really missing."""

    def arch(args):
        if not OmegaConf.is_config(args):
            fn(args)

    arch.__name__, arch.__qualname__, arch.__doc__ = fn.__name__, fn.__qualname__, fn.__doc__
    arch.__module__ = fn.__module__
    arch.run = fn  # the function itself, for model_args
    return arch


def model_args(cfg, dc, model_name: str, base: Callable[[Namespace], None],
               complete: Optional[Callable[[Namespace], None]] = None) -> Namespace:
    """The options of the model ``cfg`` asks for, resolved: the given values (checked), then
    the architecture's presets, then ``base`` (the model's defaults), then ``complete`` (the
    model's own checks, which may fill in options derived from others), then :func:`check`;
    the result is recorded into ``cfg``.

    ``cfg`` is what fairseq hands ``build_model``: a Namespace (argparse, in-process), a
    DictConfig (hydra, checkpoints) or a ``dc`` instance. The result is the same Namespace a
    ``fairseq-train --arch ...`` of the same settings gives, whichever it was."""
    arch = arch_name(cfg, model_name)
    args = Namespace(**_given(cfg, dc, arch))
    args.arch = arch
    preset = ARCH_CONFIG_REGISTRY.get(arch)
    if preset is not None:
        getattr(preset, "run", preset)(args)
    base(args)
    check(args, dc)  # before the model's checks, which may compare the values
    if complete is not None:
        complete(args)
        check(args, dc)
    record(cfg, args, dc)
    return args


def describe(dc: Type) -> Dict[str, Dict[str, Any]]:
    """{field: {help, default, choices, ...}} of ``dc`` (for docs and tests)."""
    out = {}
    for f in dataclasses.fields(dc):
        if f.name.startswith("_"):
            continue
        meta = dict(f.metadata)
        out[f.name] = {"type": _inner_type(f.type), "help": meta.get("help"),
                       "default": meta.get(ARCH_DEFAULT), "choices": meta.get("choices"),
                       "min": meta.get("min"), "max": meta.get("max"),
                       "fairseq": bool(meta.get("fairseq")),
                       "from_config": meta.get("from_config")}
    return out


def parse_layer_indices(spec: Optional[str], flag: str) -> Optional[List[int]]:
    """``"0,2"`` -> [0, 2] (sorted, unique); None or "" -> None (all layers)."""
    if spec is None or spec == "":
        return None
    try:
        return sorted({int(tok) for tok in str(spec).split(",") if tok.strip() != ""})
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated layer indices, got {spec!r}") from None
