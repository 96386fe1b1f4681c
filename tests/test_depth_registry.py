"""The depth connections' registry (fairseq_plugins/depth/registry.py): what the package
derives from the methods' declarations, and that nothing outside depth/ names a method."""
import ast
import dataclasses
from pathlib import Path

import pytest

import fairseq_plugins
from fairseq_plugins import depth
from fairseq_plugins.config import flag
from fairseq_plugins.depth import registry
from fairseq_plugins.models.layerwise import options as layerwise_options
from fairseq_plugins.models.layerwise import presets as layerwise_presets

PACKAGE = Path(fairseq_plugins.__file__).parent
METHOD_MODULES = {method.build.__module__.rsplit(".", 1)[1] for method in depth.METHODS}


def _outside_depth():
    return [p for p in PACKAGE.rglob("*.py") if "depth" not in p.relative_to(PACKAGE).parts]


def _names_a_method(tree) -> list:
    """The method modules a module imports or reaches as ``depth.<module>``: ``fusion`` is
    allowed (a family lays out its blocks' fuse-attention sub-layers from fusion.resolve)."""
    named = set()
    for node in ast.walk(tree):
        parts = node.module.split(".") if isinstance(node, ast.ImportFrom) and node.module else []
        if "depth" in parts:
            named |= set(parts[parts.index("depth") + 1:]) & METHOD_MODULES
            if parts[-1] == "depth":
                named |= {alias.name for alias in node.names} & METHOD_MODULES
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "depth" and node.attr in METHOD_MODULES:
            named.add(node.attr)
    return sorted(named - {"fusion"})


def test_no_module_outside_depth_names_a_method():
    offenders = {str(p.relative_to(PACKAGE)): _names_a_method(ast.parse(p.read_text()))
                 for p in _outside_depth()}
    assert {path: names for path, names in offenders.items() if names} == {}


def test_the_scan_finds_a_module_that_names_a_method():
    """The check above can fail: it finds each way of naming a method."""
    for source in ("from ..depth import mudd", "from fairseq_plugins.depth.mhc import sinkhorn",
                   "from ... import depth\nx = depth.value_residual.FLAG"):
        assert _names_a_method(ast.parse(source)), source


def test_every_method_declares_its_flags_presets_and_checkpoint_names():
    names, presets = set(), set()
    for method in depth.METHODS:
        fields = {flag(field.name) for field in dataclasses.fields(method.config)}
        assert set(method.flags_for(registry.SIDES)) <= fields, method.name
        assert method.name not in names and not set(method.presets) & presets
        names.add(method.name)
        presets |= set(method.presets)
        assert method.checkpoint_names, method.name
        assert method.config in depth.CONFIGS
        assert (PACKAGE.parent / "docs" / "ideas" / f"{method.name.replace('_', '-')}.md").exists()
    assert set(depth.PRESETS) == presets


def test_the_families_presets_and_refusals_are_derived_from_the_needs():
    # layerwise_transformer offers every need now: its presets are the language models' (MUDD's
    # four ways, the paper's)
    assert layerwise_options.LACKS == {}
    derived = depth.presets_for(layerwise_options.LACKS)
    assert layerwise_presets.LAYERWISE_DEPTH == derived
    assert derived["mudd"] == {"mudd": True}
    assert set(derived) == set(depth.PRESETS)
    # a family lacking separate inputs gets the remedy's options
    reduced = depth.presets_for({registry.SEPARATE_INPUTS: "why not"})
    assert reduced["mudd"] == {"mudd": True, "mudd_ways": "r"}
    # a need no remedy meets drops the preset
    assert "value_residual" not in depth.presets_for({registry.VALUE_HOOK: "why not"})
    flags = depth.weight_flags(registry.SIDES, {registry.SEPARATE_INPUTS: "why not"})
    assert "--mudd --mudd-ways r" in flags and "--value-residual" in flags
    assert "--value-residual" not in depth.weight_flags(registry.SIDES,
                                                        {registry.VALUE_HOOK: "why not"})
    flags = depth.weight_flags(registry.SIDES)
    assert flags[:2] == ["--encoder-fusion", "--decoder-fusion"] and "--mudd" in flags


def test_an_unmet_need_is_one_line_naming_the_family_why_and_the_remedy():
    toy = registry.Method("toy", "--toy", object, lambda args: args.toy, lambda args, stack: None,
                          needs=lambda args: frozenset({registry.SEPARATE_INPUTS}),
                          remedies={registry.SEPARATE_INPUTS: "use --toy-ways r"})

    class Args:
        toy = True
    line = registry.unmet([toy], Args, {registry.SEPARATE_INPUTS: "why not"}, "fam")
    assert line == (f"--toy needs {registry.SEPARATE_INPUTS}, which fam does not offer (why not):"
                    " use --toy-ways r")
    assert registry.unmet([toy], Args, {}, "fam") is None
    Args.toy = False
    assert registry.unmet([toy], Args, {registry.SEPARATE_INPUTS: "why not"}, "fam") is None


@pytest.mark.parametrize("bad", [dict(role="sideways"), dict(remedies={"wings": "none"})])
def test_a_bad_declaration_is_refused_when_the_method_is_declared(bad):
    with pytest.raises(ValueError):
        registry.Method("toy", "--toy", object, bool, lambda args, stack: None, **bad)


def test_a_flag_per_stack_is_on_in_its_own_stack_only():
    class Args:
        encoder_fusion, decoder_fusion, mudd = True, False, True
    assert depth.active_flags(Args, "decoder") == ["--mudd"]
    assert depth.active_flags(Args, "encoder") == ["--encoder-fusion", "--mudd"]
    assert depth.active_flags(Args) == ["--encoder-fusion", "--mudd"]


def test_every_module_with_weights_to_log_offers_them_one_way():
    """A module offers weights to --log-layer-weights by being a WeightSource (found by type
    at build time); no other module of the package defines logged_weights."""
    import inspect

    from fairseq_plugins import weight_logging
    offering = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(item, ast.FunctionDef) and item.name == "logged_weights"
                    for item in node.body):
                offering.add(node.name)
    assert len(offering) >= 9
    classes = {name: cls for module in list(__import__("sys").modules.values())
               if getattr(module, "__name__", "").startswith("fairseq_plugins")
               for name, cls in inspect.getmembers(module, inspect.isclass)}
    assert all(issubclass(classes[name], weight_logging.WeightSource) for name in offering), \
        [name for name in offering if not issubclass(classes[name], weight_logging.WeightSource)]
