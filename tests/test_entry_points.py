"""fairseq's two entry points build the same model: ``fairseq-train`` (argparse, then fairseq's
conversion to a config) and ``fairseq-hydra-train`` (a hydra config, merged with the model's
dataclass), for every architecture of the package; and a bad option is one clear error naming it
under both, before anything is built (docs/hydra.md)."""
import dataclasses
import functools

import pytest
import torch
from omegaconf import OmegaConf

import fairseq_plugins  # noqa: F401  (registers the models)
from fairseq import options, tasks
from fairseq.dataclass.initialize import add_defaults
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models import ARCH_MODEL_NAME_REGISTRY, MODEL_DATACLASS_REGISTRY
from fairseq_plugins import config
from helpers import PLUGIN_DIR, make_dict

LMS = ("gpt_baseline_lm", "ar_encdec_lm")
MODELS = ("layerwise_transformer", *LMS)
ARCHS = sorted(a for a, m in ARCH_MODEL_NAME_REGISTRY.items() if m in MODELS)
# options given to both entry points on top of the architecture (small sizes keep it fast; the
# others exercise the presets' own options being overridden)
SETTINGS = {
    "layerwise_transformer_tiny": {"encoder_fusion": True, "fusion_kind": "dwa",
                                   "dwa_period": 2, "log_layer_weights": True},
    "fusion_transformer_tiny": {"fusion_heads": 2, "no_scale_embedding": True,
                                "decoder_fusion": False},
    "bridge_transformer_tiny": {"bridge_init": "gca"},
    "swapped_transformer_tiny": {"cross_attention_layers": "1", "cross_attention_zero_init": True},
    "ar_encdec_lm_tiny": {"pos_embed_subtraction": "yes_ln", "bias": True, "dropout": 0.1},
}
LM_CRITERION = {"ar_encdec_lm_tiny": {"_name": "lm_embedding_loss", "embedding_loss": "mse"}}


def settings(arch):
    model = ARCH_MODEL_NAME_REGISTRY[arch]
    out = {} if arch.endswith("_tiny") else (
        {"layers": 2} if model in LMS else {"encoder_layers": 2, "decoder_layers": 2})
    return {**out, **SETTINGS.get(arch, {})}


def flags(values):
    out = []
    for key, value in values.items():
        flag = config.flag(key)
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + flag[2:])
        else:
            out += [flag, str(value)]
    return out


def criterion_flags(arch):
    crit = LM_CRITERION.get(arch)
    if crit is None:
        return []
    return ["--criterion", crit["_name"], "--embedding-loss", crit["embedding_loss"]]


def parse(arch, values):
    model = ARCH_MODEL_NAME_REGISTRY[arch]
    task = "language_modeling" if model in LMS else "translation"
    argv = ["/nonexistent-data", "--task", task, "--arch", arch, "--user-dir", PLUGIN_DIR,
            *flags(values), *criterion_flags(arch)]
    return options.parse_args_and_arch(options.get_training_parser(), input_args=argv)


def make_task(args):
    if ARCH_MODEL_NAME_REGISTRY[args.arch] in LMS:
        d = make_dict(20, "w")
        return tasks.get_task("language_modeling")(args, d, d)
    joined = make_dict(20, "w")  # one dictionary: the opus-mt presets share all embeddings
    return tasks.get_task("translation")(args, joined, joined)


@functools.lru_cache(maxsize=None)
def _fairseq_root():
    """fairseq-hydra-train's schema (the structured FairseqConfig), not in struct mode. Made once
    (~50 ms each): hydra_model_config replaces its task, criterion and model nodes, the only ones
    it or add_defaults writes, at every call."""
    from fairseq.dataclass.configs import FairseqConfig

    root = OmegaConf.structured(FairseqConfig)
    OmegaConf.set_struct(root, False)
    return root


def hydra_model_config(arch, values, merged=True, task_values=None):
    """cfg.model as fairseq-hydra-train hands it to the task: the user's model node, merged with
    the registered dataclasses by add_defaults (fairseq-train's main calls it once the plugin is
    imported), resolved and made a plain struct config. ``merged=False``: the raw node (the
    model's build_model must not depend on the merge). ``task_values``: the task node's
    settings beyond its name and data."""
    model = ARCH_MODEL_NAME_REGISTRY[arch]
    root = _fairseq_root()
    root.task = {"_name": "language_modeling" if model in LMS else "translation",
                 "data": "/nonexistent-data", **(task_values or {})}
    root.criterion = LM_CRITERION.get(arch, {"_name": "cross_entropy"})
    root.model = {"_name": arch, **values}
    if merged:
        add_defaults(root)
    root = OmegaConf.create(OmegaConf.to_container(root, resolve=True, enum_to_str=True))
    OmegaConf.set_struct(root, True)
    return root.model


def build(task, cfg, seed=0):
    torch.manual_seed(seed)
    return task.build_model(cfg)


def assert_same_model(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        assert sa[key].shape == sb[key].shape, key
        assert torch.equal(sa[key], sb[key]), key


@pytest.mark.parametrize("arch", ARCHS)
def test_both_entry_points_build_the_same_model(arch):
    values = settings(arch)
    args = parse(arch, values)
    task = make_task(args)
    # fairseq-train: the argparse Namespace, converted to a config as fairseq-train does
    via_argparse = build(task, convert_namespace_to_omegaconf(args).model)
    via_hydra = build(task, hydra_model_config(arch, values))
    assert_same_model(via_argparse, via_hydra)
    assert_same_model(via_argparse, build(task, hydra_model_config(arch, values, merged=False)))
    assert_same_model(via_argparse, build(task, args))  # in-process: the Namespace itself
    assert via_argparse.__class__ is via_hydra.__class__
    assert via_hydra.log_layer_weights == bool(values.get("log_layer_weights"))


def test_the_preset_is_what_hydra_builds_not_the_plain_model():
    """The reported defect: model._name=fusion_transformer_tiny built a plain transformer."""
    args = parse("fusion_transformer_tiny", {})
    task = make_task(args)
    fused = build(task, hydra_model_config("fusion_transformer_tiny", {}))
    plain = build(task, hydra_model_config("layerwise_transformer_tiny", {}))
    assert all(layer.fuse_attn is not None for layer in fused.encoder.layers[1:])
    assert sum(p.numel() for p in fused.parameters()) > sum(p.numel() for p in plain.parameters())
    # an option the user gives explicitly wins over the preset's, also when it is the default
    unfused = build(task, hydra_model_config("fusion_transformer_tiny", {"encoder_fusion": False}))
    assert all(getattr(layer, "fuse_attn", None) is None for layer in unfused.encoder.layers)


def test_the_checkpoint_config_records_every_resolved_option():
    cfg = hydra_model_config("bridge_transformer_tiny", {})
    task = make_task(parse("bridge_transformer_tiny", {}))
    build(task, cfg)
    assert cfg.bridge == "fc" and cfg.bridge_init == "original"  # written back at build time
    assert cfg.encoder_embed_dim == 64 and cfg.encoder_fusion is False
    lm = hydra_model_config("ar_encdec_lm_tiny", {})
    build(make_task(parse("ar_encdec_lm_tiny", {})), lm)
    assert lm.embedding_loss_norms is True and lm.criterion == "lm_embedding_loss"


def test_every_arch_function_sets_only_options_of_its_dataclass():
    """What a preset sets is a field of the model's dataclass, so that a checkpoint's stored
    config never holds a key the model's options would reject."""
    from argparse import Namespace

    from fairseq.models import ARCH_CONFIG_REGISTRY

    for arch in ARCHS:
        dc = MODEL_DATACLASS_REGISTRY[ARCH_MODEL_NAME_REGISTRY[arch]]
        args = Namespace()
        preset = ARCH_CONFIG_REGISTRY[arch]
        getattr(preset, "run", preset)(args)
        known = {f.name for f in dataclasses.fields(dc)}
        assert set(vars(args)) <= known, (arch, set(vars(args)) - known)


# -- bad input: every option field, both entry points ------------------------------------------
def _wrong_type(kind, choices):
    if choices:
        return "bogus-choice"
    return {bool: "maybe", int: "abc", float: "abc"}.get(kind)


def _bad_cases():
    cases = []
    for model in MODELS:
        arch = next(a for a in ARCHS if ARCH_MODEL_NAME_REGISTRY[a] == model
                    and a.endswith("_tiny"))
        for name, meta in config.describe(MODEL_DATACLASS_REGISTRY[model]).items():
            if meta["from_config"]:
                continue
            wrong = _wrong_type(meta["type"], meta["choices"])
            if wrong is not None:
                cases.append((arch, name, wrong))
            if meta["min"] is not None:
                low = meta["min"]
                cases.append((arch, name, low - (1 if isinstance(low, int) else 0.5)))
            if meta["max"] is not None:
                cases.append((arch, name, meta["max"] + 0.5))
    return cases


BAD = _bad_cases()
_TASKS = {}


def task_of(arch):
    if arch not in _TASKS:
        _TASKS[arch] = make_task(parse(arch, {}))
    return _TASKS[arch]


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "raw"])
def test_a_bad_option_under_hydra_is_one_error_naming_it(merged):
    assert len(BAD) > 60
    for arch, name, value in BAD:
        with pytest.raises(Exception) as info:
            build(task_of(arch), hydra_model_config(arch, {name: value}, merged=merged))
        message = str(info.value).splitlines()[0] + str(getattr(info.value, "full_key", ""))
        assert name in message, (arch, name, value, message)
        assert "Traceback" not in message


def test_a_bad_option_under_argparse_is_one_error_naming_it(capsys):
    for arch, name, value in BAD:
        meta = config.describe(MODEL_DATACLASS_REGISTRY[ARCH_MODEL_NAME_REGISTRY[arch]])[name]
        if meta["type"] is bool and not isinstance(value, (int, float)):
            continue  # argparse has no value to give a --flag/--no-flag
        with pytest.raises((SystemExit, ValueError)) as info:
            # the Namespace as parsed (fairseq-train's conversion to a config in between is
            # fairseq's, timed out of this loop; the test above runs it for every arch)
            task_of(arch).build_model(parse(arch, {name: value}))
        shown = capsys.readouterr().err if info.type is SystemExit else str(info.value)
        assert config.flag(name) in shown, (arch, name, value, shown)


def test_an_unknown_option_under_hydra_names_it_and_suggests_the_right_one():
    task = make_task(parse("fusion_transformer_tiny", {}))
    with pytest.raises(config.ConfigError, match=r"model.fusion_kindd: no such option of "
                                                 r"fusion_transformer_tiny; did you mean "
                                                 r"model.fusion_kind\?"):
        build(task, hydra_model_config("fusion_transformer_tiny", {"fusion_kindd": "dwa"},
                                       merged=False))
    with pytest.raises(Exception, match="fusion_kindd"):
        hydra_model_config("fusion_transformer_tiny", {"fusion_kindd": "dwa"})


def hydra_criterion(node):
    """cfg.criterion as fairseq-hydra-train hands it over (see hydra_model_config)."""
    from fairseq.dataclass.configs import FairseqConfig

    root = OmegaConf.structured(FairseqConfig)
    OmegaConf.set_struct(root, False)
    root.criterion = node
    add_defaults(root)
    root = OmegaConf.create(OmegaConf.to_container(root, resolve=True, enum_to_str=True))
    return root.criterion


def test_the_criterion_is_the_same_under_both_entry_points():
    values = {"embedding_loss": "cosine", "embedding_loss_coeff": 8.0}
    args = options.parse_args_and_arch(options.get_training_parser(), input_args=[
        "/nonexistent-data", "--task", "language_modeling", "--arch", "ar_encdec_lm_tiny",
        "--user-dir", PLUGIN_DIR, "--criterion", "lm_embedding_loss", "--embedding-loss",
        "cosine", "--embedding-loss-coeff", "8"])
    task = make_task(args)
    via_argparse = task.build_criterion(convert_namespace_to_omegaconf(args).criterion)
    via_hydra = task.build_criterion(hydra_criterion({"_name": "lm_embedding_loss", **values}))
    assert type(via_argparse) is type(via_hydra)
    for name in ("embedding_loss", "coeff", "sentence_avg"):
        assert getattr(via_argparse, name) == getattr(via_hydra, name), name
    assert (via_hydra.embedding_loss, via_hydra.coeff) == ("cosine", 8.0)
    with pytest.raises(ValueError, match="--embedding-loss-coeff must be > 0"):
        task.build_criterion(hydra_criterion({"_name": "lm_embedding_loss",
                                              "embedding_loss": "mse",
                                              "embedding_loss_coeff": -1.0}))


def test_criterion_and_task_dataclasses_check_every_field_under_hydra():
    """A value of the wrong type for every field the package's criterion and task declare
    (beyond fairseq's own) is an error naming it when hydra merges the configuration."""
    from fairseq.criterions import CRITERION_DATACLASS_REGISTRY
    from fairseq.criterions.cross_entropy import CrossEntropyCriterionConfig
    from fairseq.dataclass.utils import merge_with_parent
    from fairseq.tasks import TASK_DATACLASS_REGISTRY
    from fairseq.tasks.translation import TranslationConfig

    checked = 0
    for dc, parent in ((CRITERION_DATACLASS_REGISTRY["lm_embedding_loss"],
                        CrossEntropyCriterionConfig),
                       (TASK_DATACLASS_REGISTRY["seq2seq_eval"], TranslationConfig)):
        inherited = {f.name for f in dataclasses.fields(parent)}
        for f in dataclasses.fields(dc):
            if f.name in inherited:
                continue
            kind = config._inner_type(f.type)
            wrong = "abc" if kind in (int, float) else "maybe" if kind is bool else (
                "bogus" if kind is not str else None)
            if wrong is None:
                continue  # a free string: every value is one
            with pytest.raises(Exception, match=f.name):
                merge_with_parent(dc, OmegaConf.create({f.name: wrong}))
            checked += 1
    assert checked == 5  # embedding_loss, embedding_loss_coeff, eval_exact_match, eval_cter, ..._strict


def test_the_plugin_does_not_import_the_experiment_library():
    import subprocess
    import sys

    code = ("import sys, fairseq_plugins; bad = sorted(m for m in sys.modules "
            "if m.split('.')[0] == 'layerlab'); print(bad); sys.exit(bool(bad))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# -- the real CLIs --------------------------------------------------------------------------------
def test_fairseq_train_and_fairseq_hydra_train_give_identical_checkpoints(scan_bin, tmp_path):
    """The shipped SCAN config under fairseq-hydra-train and the same settings as fairseq-train
    flags: after 2 updates with the same seed, the same parameter names and bit-identical
    values (same model, same initialisation, same training)."""
    from conftest import run_cli

    common = ["optimization.max_update=2", "dataset.disable_validation=true",
              "dataset.num_workers=0"]
    run_cli("fairseq-hydra-train", "--config-dir", f"{PLUGIN_DIR}/hydra_configs",
            "--config-name", "scan_quickstart", f"task.data={scan_bin / 'bin'}",
            f"common.user_dir={PLUGIN_DIR}", f"checkpoint.save_dir={tmp_path / 'hydra'}",
            *common, cwd=tmp_path)
    run_cli("fairseq-train", scan_bin / "bin", "--user-dir", PLUGIN_DIR, "--task", "seq2seq_eval",
            "--eval-exact-match", "--eval-bleu-args",
            '{"beam": 1, "max_len_a": 0, "max_len_b": 64}', "--arch", "fusion_transformer_tiny",
            "--encoder-ffn-embed-dim", "256", "--decoder-ffn-embed-dim", "256", "--dropout", "0",
            "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "0.003",
            "--lr-scheduler", "polynomial_decay", "--warmup-updates", "200",
            "--total-num-update", "2", "--end-learning-rate", "0", "--max-tokens", "2048",
            "--max-update", "2", "--seed", "1", "--disable-validation", "--no-epoch-checkpoints",
            "--num-workers", "0", "--save-dir", tmp_path / "argparse", cwd=tmp_path)
    hydra = torch.load(tmp_path / "hydra" / "checkpoint_last.pt", weights_only=False)
    argparse_ = torch.load(tmp_path / "argparse" / "checkpoint_last.pt", weights_only=False)
    assert list(hydra["model"]) == list(argparse_["model"])
    assert any("fuse_attn" in key for key in hydra["model"])  # the preset, not a plain model
    for key, value in hydra["model"].items():
        assert torch.equal(value, argparse_["model"][key]), key
    # the stored config says which model it is, whichever entry point wrote it
    for ckpt in (hydra, argparse_):
        model_cfg = ckpt["cfg"]["model"]
        assert model_cfg["encoder_fusion"] is True and model_cfg["encoder_ffn_embed_dim"] == 256


def test_a_bad_option_under_fairseq_hydra_train_is_one_line(scan_bin, tmp_path, monkeypatch):
    """As argparse's refusals: `fairseq-hydra-train: error: <message>`, status 2, no traceback
    (hydra's own report would print a stack trace and exit 1); FAIRSEQ_PLUGINS_TRACEBACK=1
    leaves it to hydra."""
    from conftest import run_cli

    argv = ["fairseq-hydra-train", "--config-dir", f"{PLUGIN_DIR}/hydra_configs", "--config-name",
            "scan_quickstart", f"task.data={scan_bin / 'bin'}", f"common.user_dir={PLUGIN_DIR}",
            f"checkpoint.save_dir={tmp_path / 'hydra'}", "dataset.num_workers=0",
            "+model.fusion_layers='0,9'"]
    proc = run_cli(*argv, cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("fairseq-hydra-train: error: ") and "--fusion-layers" in last, last
    monkeypatch.setenv("FAIRSEQ_PLUGINS_TRACEBACK", "1")
    proc = run_cli(*argv, cwd=tmp_path, check=False)
    assert proc.returncode == 1 and "--fusion-layers" in proc.stderr


def test_layer_weights_are_logged_to_tensorboard(scan_bin, tmp_path):
    """--log-layer-weights with --tensorboard-logdir: fuse-attention's mean weights and the FC
    bridge's block norms, read back from the event file. With a learning rate of 0 the bridge
    keeps its "original" initialisation (decoder layer i reads the last encoder layer through
    the identity: block norm sqrt(d) = 8, every other block 0), and each layer's fuse-attention
    weights sum to 1 over the states it attends."""
    from conftest import train
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = tmp_path / "tb"
    train(scan_bin, "fusion_transformer_tiny", "--bridge", "fc", "--log-layer-weights",
          "--tensorboard-logdir", logdir, "--log-interval", "2", "--disable-validation",
          "--lr", "0", updates=4, name="tensorboard")
    events = EventAccumulator(str(logdir / "train_inner"))
    events.Reload()
    tags = [t for t in events.Tags()["scalars"] if t.startswith("lw_")]
    values = {t: [e.value for e in events.Scalars(t)] for t in tags}
    assert all(len(v) == 2 for v in values.values())  # updates 2 and 4
    bridge = {t: v for t, v in values.items() if t.startswith("lw_encoder_bridge_")}
    assert len(bridge) == 2 * 2  # 2 decoder layers x 2 encoder layers (h_1, h_2)
    for tag, v in bridge.items():
        assert v == pytest.approx([8.0] * 2 if tag.endswith("_e2") else [0.0] * 2, abs=1e-4)
    for side, layers in (("encoder", (0, 1)), ("decoder", (0, 1))):
        for layer in layers:
            states = [t for t in values if t.startswith(f"lw_{side}_layers_{layer}_fuse_attn_s")]
            assert len(states) == layer + 1, (side, layer, states)
            for step in range(2):
                assert sum(values[t][step] for t in states) == pytest.approx(1.0, abs=1e-3)


# -- --log-layer-weights in-process ---------------------------------------------------------------
def test_log_layer_weights_on_a_model_without_layer_weights_is_a_build_time_error():
    """The error names the options of that model that would give it weights to log, and each
    of them, switched on, does."""
    import re

    from helpers import build_language_model, build_translation_model

    values = {"--hyper-connections": ["static"], "--mhc": ["sinkhorn"],
              "--frac-connections": ["static"], "--attn-res": ["full"],
              "--value-residual": ["learnable"], "--laurel": ["rw_lr"]}
    pre_norm = ["--encoder-normalize-before", "--decoder-normalize-before"]
    for build, arch, extra, expect, refused in (
            (build_translation_model, "layerwise_transformer_tiny", pre_norm,
             # every depth connection, MUDD's four ways and value residual included (the
             # seq2seq self-attention takes them: modules/depth_self_attention.py)
             ["--encoder-fusion", "--bridge fc", "--bridge transparent", "--mhc", "--mudd",
              "--value-residual"], ["--mudd --mudd-ways r"]),
            (build_language_model, "gpt_baseline_lm_tiny", [],
             ["--decoder-fusion", "--mhc", "--value-residual"], ["--encoder-fusion", "--bridge"]),
            (build_language_model, "ar_encdec_lm_tiny", [],
             ["--encoder-fusion", "--decoder-fusion", "--mudd"], ["--bridge"])):
        with pytest.raises(ValueError, match=f"--log-layer-weights: {arch} has no") as error:
            build(arch, ["--log-layer-weights"])
        offers = re.search(r"switch on a method that has them: (.*)$", str(error.value)).group(1)
        offers = offers.split(", ")
        assert set(expect) <= set(offers) and not set(refused) & set(offers), offers
        for offer in offers:
            flag, *value = offer.split()
            model, _, _ = build(arch, [*extra, flag, *(value or values.get(flag, [])),
                                       "--log-layer-weights"])
            assert model.layer_weight_sources, offer


@pytest.mark.parametrize("method", [["--hyper-connections", "dynamic"], ["--mhc", "sinkhorn"],
                                    ["--frac-connections", "static"]])
def test_multi_stream_methods_log_every_sub_layer(method):
    from helpers import build_language_model

    model, _, _ = build_language_model("gpt_baseline_lm_tiny", [*method, "--log-layer-weights"])
    (path, connection), = model.layer_weight_sources.items()
    sub_layers = len(connection.sites)
    assert sub_layers == 2 * 4  # 4 blocks of attention and FFN
    keys = connection.logged_weights()
    assert {f"k{k}_keep" for k in range(sub_layers)} <= set(keys), sorted(keys)


def test_mudd_logs_every_blocks_aggregate():
    """Every DA's static weights per way and state; at initialisation each way reads the
    newest state only (weight 1 on it, 0 on the others)."""
    from helpers import build_language_model

    model, _, _ = build_language_model("gpt_baseline_lm_tiny", ["--mudd", "--log-layer-weights"])
    weights = model.decoder.depth.connection.logged_weights()
    expected = {}
    for i in range(4):  # 4 blocks: states x_0 .. x_{i+1}; the last block mixes the residual only
        for way in ("r" if i == 3 else "qkvr"):
            expected.update({f"b{i}_{way}_s{j}": float(j == i + 1) for j in range(i + 2)})
    assert {k: float(v) for k, v in weights.items()} == expected


def test_list_options_prints_each_option_with_the_value_the_arch_gives_it():
    import sys

    from conftest import run_command

    run = [sys.executable, "-m", "fairseq_plugins.list_options"]
    proc = run_command(run + ["gpt_baseline_lm_mhc_tiny"])
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())  # argparse wraps the help
    assert "options of gpt_baseline_lm_mhc_tiny (fairseq-hydra-train: model.<name>)" in text
    for option, value in (("--mhc {none,sinkhorn,lite}", "sinkhorn"), ("--layers", "4"),
                          ("--embed-dim D", "32"), ("--attention-heads H", "4"),
                          ("--hyper-connections {none,static,dynamic}", "none")):
        entry = text[text.index(option + " "):]
        entry = entry[:entry.index("]") + 1]
        assert entry.endswith(f"[gpt_baseline_lm_mhc_tiny: {value}]"), entry
    proc = run_command(run + ["transformer"])
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith(
        "python -m fairseq_plugins.list_options: error: 'transformer' is not an architecture "
        "of this package; its architectures: ar_encdec_lm, ")


def test_an_option_the_hydra_config_does_not_set_takes_a_plus():
    """docs/hydra.md: `+model.fusion_kind=dwa` on the shipped SCAN config; without the `+`
    hydra refuses the key (the docs' fairseq-hydra-train run uses the `+` form)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException

    # version_base 1.1: what fairseq assumes (the setting outlives the context)
    with initialize_config_dir(config_dir=f"{PLUGIN_DIR}/hydra_configs", version_base="1.1"):
        assert compose("scan_quickstart", ["+model.fusion_kind=dwa"]).model.fusion_kind == "dwa"
        with pytest.raises(ConfigCompositionException,
                           match="Could not override 'model.fusion_kind'"):
            compose("scan_quickstart", ["model.fusion_kind=dwa"])


def test_each_method_logs_its_own_weights_in_training_only():
    from fairseq.logging import metrics
    from helpers import build_translation_model, random_batch

    for arch, expect in (("dwa_transformer_tiny", "depth_connection_averages"),
                         ("transparent_transformer_tiny", "bridge"),
                         ("fusion_transformer_tiny", "fuse_attn")):
        model, task, _ = build_translation_model(arch, ["--log-layer-weights"])
        src, lengths, prev = random_batch(task.source_dictionary, task.target_dictionary)
        with metrics.aggregate(new_root=True) as agg:
            model.eval()
            model(src, lengths, prev)
            assert not any(k.startswith("lw_") for k in agg.get_smoothed_values()), arch
            model.train()
            model(src, lengths, prev)
            logged = {k: v for k, v in agg.get_smoothed_values().items() if k.startswith("lw_")}
        assert logged and all(expect in k for k in logged), (arch, list(logged))
        if arch == "dwa_transformer_tiny":  # the alphas themselves
            alphas = model.encoder.depth.connection.averages["1"].weight.tolist()
            assert [logged[f"lw_encoder_depth_connection_averages_1_s{j}"] for j in range(3)] == \
                pytest.approx(alphas, abs=1e-5)
        if arch == "transparent_transformer_tiny":  # each decoder layer's weights sum to 1
            for i in range(2):
                row = [v for k, v in logged.items() if k.startswith(f"lw_encoder_bridge_d{i}_")]
                assert len(row) == 3 and sum(row) == pytest.approx(1.0, abs=1e-4)
