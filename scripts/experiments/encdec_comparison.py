#!/usr/bin/env python3
"""The layer-relationship methods compared in encoder-decoder models (docs/ideas/comparison.md,
"Encoder-decoder models"; issue 101): Multi30k De->En (BLEU) and COGS (exact match, overall and
per category of its gen_dev part), every row a pre-norm Transformer of one recipe per task.

    python scripts/experiments/encdec_comparison.py --tasks multi30k,cogs --rows baseline,...
        --seeds 1,2,3 --out-dir ~/layerlab-runs/encdec [--recipe multi30k=NAME]
        [--launcher local|slurm] [--jobs 2] [--threads 1] [--results-name encdec_comparison_cpu]
        [--keep-runs results/encdec_runs_cpu] [--report-only]

The comparison is a declaration (``TASKS``, ``ROWS``, ``RECIPES``) run by the experiment runner
(``layerlab.runner``: plan seed by seed, resume, submitit on this machine or Slurm). Each run
trains with ``fairseq-train`` (resuming its own last checkpoint when it was stopped), validates
every epoch (the learning curve: valid BLEU, or valid exact match on COGS's in-distribution
dev), and is scored with its last checkpoint on each test subset of its task (``fairseq-generate``,
sacreBLEU on the detokenised output against the raw references; exact match with the
categories); the per-sentence statistics are kept for the tests. The report gives per task each
row's mean and seeds, its difference to the baseline with the hierarchical bootstrap and the
seed-paired test, its parameters and CPU time against the baseline's, and for COGS the
per-category and lexical / structural exact match; the rows' ranking by gain on one task
against the other's and against the WikiText-2 comparison's (Spearman's rank correlation).

``--jobs N`` trains N runs at once, each with the machine's cores / N threads (``--threads``
sets them); a second instance training into the same ``--out-dir`` is refused. ``--keep-runs
DIR`` copies each finished run's result and test statistics there (committed: a run kept there
is not trained again, on any machine), and ``--report-only`` writes the report of the runs
finished so far (each row over the seeds it has) without training.

A recipe is chosen on the baseline alone (issue 101): until a task's recipe is marked chosen
(``CHOSEN``), only the baseline row runs on it. Bad input (an unknown task, row or recipe, a
task whose data folder is missing, a row its family refuses, finished runs of another recipe
in the output folder) stops with one line before anything trains.
"""
import argparse
import dataclasses
import datetime
import json
import logging
import os
import shlex
import statistics
import sys
from typing import Dict, List, Optional, Tuple

from layerlab import paths, recipes, runner, runs, significance
from layerlab.stats import fmt, mean_std

# fairseq's models call logging.basicConfig when imported (its text_to_speech task at INFO, its
# wav2vec2 classification at DEBUG: matplotlib's font search in the report); configuring logging
# first makes those calls no-ops, so warnings and errors stay one line each
logging.basicConfig(level=logging.WARNING, format="%(message)s")

PRE_NORM = ("--encoder-normalize-before", "--decoder-normalize-before")


@dataclasses.dataclass(frozen=True)
class Task:
    """One task: its fairseq data folder, how to prepare it, its metric, the flags that validate
    it during training, and its test subsets ({label: (fairseq subset, raw reference file or
    None, categories file or None)}); ``generate``: fairseq-generate's flags."""
    data: str
    prepare: str
    metric: str
    languages: Tuple[str, str]
    valid: Tuple[str, ...]
    tests: Dict[str, Tuple[str, Optional[str], Optional[str]]]
    generate: Tuple[str, ...]
    # test subsets also validated every epoch (their learning curves): {label: fairseq subset}
    curves: Dict[str, str] = dataclasses.field(default_factory=dict)


TASKS = {
    "multi30k": Task(
        "data-bin/multi30k", "python scripts/prepare/multi30k.py --from ../shared/data/multi30k",
        "bleu", ("de", "en"),
        ("--eval-bleu", "--eval-bleu-args", '{"beam": 1, "max_len_a": 1.2, "max_len_b": 10}',
         "--eval-bleu-remove-bpe", "sentencepiece", "--eval-bleu-detok", "space"),
        {"test_2016": ("test", "data/multi30k/test.raw.en", None)},
        ("--beam", "5", "--max-len-a", "1.2", "--max-len-b", "10", "--bpe", "sentencepiece",
         "--sentencepiece-model", "data/multi30k/spm.model")),
    "cogs": Task(
        "data-bin/cogs", "python scripts/prepare/cogs.py --from ../shared/data/cogs",
        "exact_match", ("in", "out"),
        ("--task", "seq2seq_eval", "--eval-exact-match", "--valid-subset", "valid,test1"),
        {"test": ("test", None, None), "gen_dev": ("test1", None, "data/cogs/gen_dev.cat")},
        ("--beam", "1", "--max-len-a", "0", "--max-len-b", "512"),
        # gen_dev's curve beside dev's: the recipe's budget is chosen on it (issue 101), and
        # in-distribution dev saturates long before generalisation does
        {"gen_dev": "test1"}),
}
# COGS's structural generalisation categories (Kim and Linzen 2020, Table 2); the other 18 of
# gen_dev's 21 are lexical
COGS_STRUCTURAL = ("obj_pp_to_subj_pp", "cp_recursion", "pp_recursion")

BASELINE = "baseline"
# row -> (architecture, flags); every row pre-norm (the depth connections need it), the
# baseline fairseq's own transformer with the same sizes
ROWS = {
    BASELINE: ("transformer", ()),
    "lrf_encoder": ("layerwise_transformer", ("--encoder-fusion",)),
    "lrf_decoder": ("layerwise_transformer", ("--decoder-fusion",)),
    "lrf_both": ("layerwise_transformer", ("--encoder-fusion", "--decoder-fusion")),
    "bridge_gca": ("layerwise_transformer", ("--bridge", "fc", "--bridge-init", "gca")),
    "transparent": ("layerwise_transformer", ("--bridge", "transparent")),
    "dwa": ("layerwise_transformer", ("--encoder-fusion", "--decoder-fusion", "--fusion-kind",
                                      "dwa")),
    # inverted: the swapped-role variant ahead of swapped on SCAN and Multi30k
    # (results/cross_attention_{scan,multi30k}_cpu.md)
    "inverted_cross_attention": ("layerwise_transformer", ("--cross-attention", "inverted")),
    "hc_static": ("layerwise_transformer", ("--hyper-connections", "static")),
    "hc_dynamic": ("layerwise_transformer", ("--hyper-connections", "dynamic")),
    "mhc": ("layerwise_transformer", ("--mhc", "sinkhorn")),
    "frac_connections": ("layerwise_transformer", ("--frac-connections", "dynamic")),
    "attn_res_full": ("layerwise_transformer", ("--attn-res", "full")),
    # a group per layer of the Multi30k recipe's 3-layer stacks (3 is the only divisor of 3
    # but 1, and one group would leave two sources, the embedding and the sum of every
    # output); the WikiText-2 comparison's 4 blocks make 2 groups of 2. COGS's 2-layer stacks
    # do not run it (TASK_ROWS); the tests' recipe has 3 layers for it
    "attn_res_block": ("layerwise_transformer", ("--attn-res", "block", "--attn-res-blocks",
                                                 "3")),
    "mudd": ("layerwise_transformer", ("--mudd", "--mudd-ways", "qkvr")),
    "value_residual": ("layerwise_transformer", ("--value-residual", "learnable")),
    # rank 4, as in the WikiText-2 comparison (the shared rows' ranks are compared)
    "laurel_rw_lr": ("layerwise_transformer", ("--laurel", "rw_lr", "--laurel-rank", "4")),
    "laurel_pa": ("layerwise_transformer", ("--laurel", "pa", "--laurel-rank", "4")),
}
# the rows each task runs under its chosen recipe (None: every row; the tests' scale runs
# every row on both). COGS's runs cost more than Multi30k's (docs/ideas/comparison.md): it runs
# the rows whose claims are about compositional generalisation (LRF, the encoder-decoder
# connections, the swapped-role cross-attention) and one of each depth-connection family:
# Hyper-Connections by its dynamic form alone (mHC, dropped on 2026-12-06 before any of its
# COGS runs, costs 1.8x the baseline's training time there and a matched baseline besides)
TASK_ROWS: Dict[str, Optional[Tuple[str, ...]]] = {
    "multi30k": None,
    "cogs": (BASELINE, "lrf_encoder", "lrf_decoder", "lrf_both", "bridge_gca", "dwa",
             "inverted_cross_attention", "hc_dynamic", "attn_res_full", "mudd",
             "value_residual", "laurel_rw_lr"),
}

# task -> {recipe name: fairseq-train flags (sizes, regularisation, optimisation, budget)}
# each task's embeddings and regularisation, the same in all its recipes
_MULTI30K = ("--share-decoder-input-output-embed", "--dropout", "0.3", "--label-smoothing", "0.1")
_COGS = ("--share-all-embeddings", "--dropout", "0.1", "--label-smoothing", "0.0")


def _recipe(sizes, regularisation, lr, warmup, updates, linear=False, max_tokens=4096,
            extra=()):
    """One recipe's flags: ``sizes``, Adam (0.9, 0.98) with label-smoothed cross-entropy, the
    rate rising to ``lr`` over ``warmup`` updates and then its inverse square root, or with
    ``linear`` decaying linearly to zero at ``updates``, the last update; ``extra`` last."""
    schedule = (("--lr-scheduler", "polynomial_decay", "--power", "1", "--end-learning-rate",
                 "0", "--total-num-update", str(updates)) if linear
                else ("--lr-scheduler", "inverse_sqrt"))
    return sizes + ("--optimizer", "adam", "--adam-betas", "(0.9, 0.98)") + schedule + (
        "--criterion", "label_smoothed_cross_entropy") + regularisation + (
        "--lr", lr, "--warmup-updates", str(warmup), "--max-tokens", str(max_tokens),
        "--max-update", str(updates)) + extra


def _smoke(label_smoothing):
    """The tests' scale: three layers (as Multi30k's recipe: attn_res_block's groups divide
    them) of width 16, four updates (no recipe to choose)."""
    return _recipe(_sizes(3, 16, 32, 2), ("--label-smoothing", label_smoothing), "3e-3", 1, 4,
                   max_tokens=1024)


def _sizes(layers, dim, ffn, heads):
    return ("--encoder-layers", str(layers), "--decoder-layers", str(layers),
            "--encoder-embed-dim", str(dim), "--decoder-embed-dim", str(dim),
            "--encoder-ffn-embed-dim", str(ffn), "--decoder-ffn-embed-dim", str(ffn),
            "--encoder-attention-heads", str(heads), "--decoder-attention-heads", str(heads))


RECIPES = {
    "multi30k": {
        # a first candidate, measured on the baseline (docs/ideas/comparison.md): 3+3 layers,
        # d = 256; its CPU time per epoch decides whether it fits the budget
        "d256": _recipe(_sizes(3, 256, 1024, 4), _MULTI30K, "1e-3", 1000, 8000),
        # the second: 3+3, d = 128 at lr 1e-3 / 1,000 warm-up updates (4.7 minutes an epoch);
        # this third is the same model on the schedule Vaswani et al.'s rule gives width 128
        # (peak d^-0.5 * warmup^-0.5 ~ 2e-3 at 500 updates), capped at 40 epochs for the curve
        "d128": _recipe(_sizes(3, 128, 512, 4), _MULTI30K, "2e-3", 500, 5400),
        # the same model and peak, the rate decaying linearly to zero at 20 epochs (2,700
        # updates): the inverse square root above still gained ~1 BLEU every five epochs at 23
        "d128_linear20": _recipe(_sizes(3, 128, 512, 4), _MULTI30K, "2e-3", 500, 2700,
                                 linear=True),
        "smoke": _smoke("0.1"),
    },
    "cogs": {
        "d256": _recipe(_sizes(2, 256, 512, 4), _COGS, "1e-3", 1000, 10000),
        "d128": _recipe(_sizes(2, 128, 512, 4), _COGS, "2e-3", 500, 20000),
        # chosen (as Multi30k's): the rate decaying linearly to zero at 30 epochs (8,460
        # updates), validated every second epoch (the two validations are half of an epoch's
        # time); the inverse square root above still gained ~3 gen_dev points an epoch at 21
        "d128_linear30": _recipe(_sizes(2, 128, 512, 4), _COGS, "2e-3", 500, 8460, linear=True,
                                 extra=("--validate-interval", "2")),
        "smoke": _smoke("0.0"),
    },
}
# the recipe every row of a task runs with once it is chosen on the baseline (None: not yet:
# only the baseline runs, to choose it)
CHOSEN: Dict[str, Optional[str]] = {"multi30k": "d128_linear20", "cogs": "d128_linear30"}
TEST_RECIPE = "smoke"  # runs every row (the tests' scale is no recipe to choose)
# the fewest seeds on either side of a test that give a verdict (as the LM comparison's: with
# fewer a bootstrap over seeds sees too little of their spread)
VERDICT_SEEDS = 3
MATCH_ABOVE = 0.02  # a row with more extra parameters than this gets a matched baseline
# the machine of the runs that finished before each run's machine was recorded (from
# 2026-12-06): all of them trained on one machine, in the sessions of 2026-12-05, every restart
# resuming their checkpoints there; their CPU times compare with each other, not with a
# recorded run's
UNRECORDED_MACHINE = "not recorded (the first runs' one machine)"
# the rows shared with the WikiText-2 comparison (its 8,000-update report, at 4 blocks, where
# every one of its rows has three seeds), by their names there: the language model's LRF row
# fuses in its decoder, as lrf_decoder does here. Ranked against it on each task's test
# subset named in RANKED (Spearman's rank correlation of the gains over the baseline)
LM_REPORT = os.path.join("results", "lm_depth_comparison_8k_cpu.json")
LM_DEPTH = "4"
LM_ROWS = {"lrf_decoder": "lrf", "dwa": "dwa", "hc_static": "hc_static",
           "hc_dynamic": "hc_dynamic", "mhc": "mhc", "frac_connections": "frac_connections",
           "attn_res_full": "attn_res_full", "attn_res_block": "attn_res_block", "mudd": "mudd",
           "value_residual": "value_residual", "laurel_rw_lr": "laurel_rw_lr",
           "laurel_pa": "laurel_pa"}
RANKED = {"multi30k": "test_2016", "cogs": "gen_dev"}
# each task's benchmark of its rows at the recipe's size (scripts/bench/encdec.py): the report's
# time and memory ratios, read where its recipe is the report's
BENCH = os.path.join("results", "bench_encdec_{task}_cpu.json")


def runs_in(task, recipe, row) -> bool:
    """Whether ``row`` runs in ``task`` under ``recipe``: the baseline always; the other rows
    at the tests' scale, and under the chosen recipe where TASK_ROWS has them."""
    if row == BASELINE or recipe == TEST_RECIPE:
        return True
    return recipe == CHOSEN[task] and (TASK_ROWS[task] is None or row in TASK_ROWS[task])


def model_flags(task, name, row: runner.Row) -> List[str]:
    """The flags that decide a row's model under a recipe (sizes, pre-norm, the row's own,
    which come last and so win: a matched baseline's FFN width)."""
    return [*RECIPES[task][name], *PRE_NORM, *row.flags]


def row_of(name) -> runner.Row:
    return runner.Row(name, ROWS[name][0], tuple(ROWS[name][1]))


def recipe_of(task, name, row: runner.Row, data) -> dict:
    """Everything that makes a run's number: its fairseq-train and fairseq-generate flags and
    the checkpoint it is scored with (stored in result.json; a finished run must match). The
    validation flags come last: COGS's ``--task seq2seq_eval`` (translation that also scores
    exact match while validating) overrides the ``--task translation`` before it."""
    arch = row.arch
    spec = TASKS[task]
    source, target = spec.languages
    return {"task": task, "recipe": name, "data": data,
            "train": ["--arch", arch, "--task", "translation", "--source-lang", source,
                      "--target-lang", target, *model_flags(task, name, row), *spec.valid,
                      "--no-epoch-checkpoints", "--log-interval", "50"],
            "generate": list(spec.generate), "checkpoint": "checkpoint_last.pt"}


def run_work(run, recipe, kept=None):
    """One run of ``recipe``: train (resuming its own last checkpoint where a stopped run of
    the same recipe left one), then every test subset generated and scored -> result.json;
    ``kept``: its --keep-runs folder (a run kept there is not trained again, a finished one is
    copied there)."""
    import numpy as np

    from layerlab.fairseq_log import last_epoch_nll, read_curves

    done = runs.synced_result(run.run_dir, kept, recipe, kept_files)
    if done is not None:
        return done
    task = TASKS[run.setting]
    data = recipe["data"]
    started = os.path.join(run.run_dir, "started.json")
    resumed = os.path.exists(started) and runs.read_json(started) == recipe
    if not resumed:
        runs.fresh_run_dir(run.run_dir)
        runs.write_json(started, recipe)
    # the CPU time is the machine's: a ratio to the baseline's means something only where both
    # ran on the same one
    machines = runs.record_machine(run.run_dir, resumed)
    cpu_file = os.path.join(run.run_dir, "cpu_seconds.json")
    spent = runs.read_json(cpu_file) if os.path.exists(cpu_file) else []
    spent.append(None)  # this process's, until it ends (None: killed, its time unknown)

    def on_cpu(seconds):
        spent[-1] = round(seconds, 1)
        runs.write_json(cpu_file, spent)
    log = os.path.join(run.run_dir, "train.log")
    try:
        runs.run_logged(runs.train_command(data, run.run_dir, run.seed, recipe["train"]), log,
                        append=True, on_cpu=on_cpu)
        failure = None
    except runs.StepError as error:
        # a loss that became NaN / inf is the row's result (reported as diverged, with its
        # curve up to there); any other failure is a bug to see
        if not runs.diverged(error):
            raise
        failure = str(error)[-500:]
    checkpoint = os.path.join(run.run_dir, recipe["checkpoint"])
    result = {"task": run.setting, "row": run.row.name, "seed": run.seed, "recipe": recipe,
              "params": runs.count_params(checkpoint) if failure is None else None,
              "valid_curve": read_curves(log, task.metric)["valid"],
              "curves": {label: read_curves(log, task.metric, subset)["valid"]
                         for label, subset in task.curves.items()},
              "train_cpu_seconds": None if None in spent else round(sum(spent), 1),
              "machines": machines,
              # the last epoch's cross-entropy: training, validation and each test subset
              # validated beside it (COGS's gen_dev)
              "last_nll": last_epoch_nll(log, {"valid": "valid", **task.curves}), "tests": {},
              "package_version": runs.package_version()}
    if failure is not None:
        runs.save_result(run.run_dir, dict(result, diverged=True, error=failure))
        return runs.synced_result(run.run_dir, kept, recipe, kept_files)
    for label, (subset, ref, categories) in task.tests.items():
        log = os.path.join(run.run_dir, f"generate-{label}.txt")
        runs.run_logged(runs.generate_command(data, checkpoint, subset, recipe["generate"]), log)
        hypotheses, references = runs.generation(log, ref)
        stats = significance.sentence_stats(task.metric, hypotheses, references)
        np.save(os.path.join(run.run_dir, f"test_stats_{label}.npy"), stats)
        entry = {task.metric: round(significance.score(task.metric, stats), 2),
                 "sentences": len(hypotheses)}
        if categories:
            from fairseq_plugins.metrics.exact_match import exact_match
            from fairseq_plugins.metrics.generate_log import read_lines

            scored = exact_match(hypotheses, references, read_lines(categories))
            entry["per_category"] = {k: v["exact_match"]
                                     for k, v in scored["per_category"].items()}
        result["tests"][label] = entry
    runs.save_result(run.run_dir, result)
    return runs.synced_result(run.run_dir, kept, recipe, kept_files)


def kept_files(folder) -> List[str]:
    """What a run keeps under --keep-runs (committed): its result and the per-sentence
    statistics of each test subset (the tests' input; the outputs and checkpoints stay)."""
    return ["result.json", *sorted(n for n in os.listdir(folder)
                                   if n.startswith("test_stats_") and n.endswith(".npy"))]


def kept_dir(keep_runs, run) -> Optional[str]:
    """A run's folder under ``--keep-runs`` (None without it): <task>/<row>/seed<n>."""
    return (os.path.join(keep_runs, run.setting, run.row.name, f"seed{run.seed}")
            if keep_runs else None)


def build_model(task, name, row: runner.Row, data):
    """The row's model as fairseq-train builds it, over the task's dictionaries (a flag its
    family refuses raises)."""
    from fairseq.data import Dictionary

    from fairseq_plugins import inprocess

    dicts = [Dictionary.load(os.path.join(data, f"dict.{lang}.txt"))
             for lang in TASKS[task].languages]
    return inprocess.build_translation_model(row.arch, model_flags(task, name, row), *dicts)[0]


def parameters(task, name, row: runner.Row, data) -> int:
    return sum(p.numel() for p in build_model(task, name, row, data).parameters())


def wider_baseline(ffn) -> runner.Row:
    """The baseline with FFN width ``ffn`` in both stacks (a matched baseline's row)."""
    base = row_of(BASELINE)
    return runner.Row(f"{BASELINE}_ffn{ffn}", base.arch, base.flags + (
        "--encoder-ffn-embed-dim", str(ffn), "--decoder-ffn-embed-dim", str(ffn)))


def matched_baseline(task, name, data, target: int) -> runner.Row:
    """The wider-FFN baseline whose parameters come nearest ``target``: the matched baseline
    of a row with more than MATCH_ABOVE extra parameters."""
    flags = RECIPES[task][name]
    ffn = int(recipes.flag_value(flags, "--encoder-ffn-embed-dim"))
    return wider_baseline(runner.nearest_width(
        lambda width: parameters(task, name, wider_baseline(width), data), ffn, 2 * ffn,
        target))


def choose(args) -> Dict[str, Tuple[str, str]]:
    """{task: (recipe name, data folder)}, each checked: one line for what cannot run."""
    for task in args.tasks:
        if task not in TASKS:
            raise runner.PlanError(f"unknown task {task!r}; known: {', '.join(TASKS)}")
    unknown = [row for row in args.rows if row not in ROWS]
    if unknown:
        raise runner.PlanError(f"unknown row(s) {', '.join(unknown)}; known: {', '.join(ROWS)}")
    out = {}
    for task in args.tasks:
        name = args.recipe.get(task) or CHOSEN[task] or next(iter(RECIPES[task]))
        if name not in RECIPES[task]:
            raise runner.PlanError(f"--recipe {task}={name}: known recipes of {task}: "
                                   f"{', '.join(RECIPES[task])}")
        data = args.data.get(task, TASKS[task].data)
        if not os.path.isdir(data):
            raise runner.PlanError(f"{task}: no data folder {data} (prepare it: "
                                   f"{TASKS[task].prepare})")
        missing = [f"dict.{lang}.txt" for lang in TASKS[task].languages
                   if not os.path.isfile(os.path.join(data, f"dict.{lang}.txt"))]
        if missing:
            raise runner.PlanError(f"{task}: {data} has no {', '.join(missing)}: not the "
                                   f"{task} data folder ({TASKS[task].prepare})")
        out[task] = (name, data)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=lambda t: t.split(","), default=list(TASKS),
                   help=f"comma-separated, of {', '.join(TASKS)} (default: both)")
    p.add_argument("--rows", type=lambda t: t.split(","), default=list(ROWS),
                   help="comma-separated row names (default: every row; under its chosen recipe "
                        "COGS runs those of TASK_ROWS)")
    p.add_argument("--seeds", type=lambda t: [int(s) for s in t.split(",")], default=[1, 2, 3],
                   help="comma-separated (default 1,2,3; every row's first seed runs first)")
    p.add_argument("--recipe", type=lambda t: dict(kv.split("=", 1) for kv in t.split(",")),
                   default={}, help="TASK=NAME[,TASK=NAME]: a recipe of RECIPES (default: the "
                                    "chosen one, or the first while none is chosen)")
    p.add_argument("--data", type=lambda t: dict(kv.split("=", 1) for kv in t.split(",")),
                   default={}, help="TASK=DIR: another data folder of that task")
    p.add_argument("--out-dir", default=os.path.expanduser("~/layerlab-runs/encdec"),
                   help="the runs' folders (<task>/<row>/seed<N>) and the report")
    runner.add_launcher_arguments(p)  # --threads: default the machine's cores / --jobs
    p.add_argument("--results-name", help="also copy the report to results/NAME.{json,md}")
    p.add_argument("--keep-runs", help="a folder (committed) each finished run's result and "
                                       "test statistics are copied to; a run kept there is "
                                       "not trained again")
    p.add_argument("--report-only", action="store_true",
                   help="write the report of the runs finished so far (in --out-dir or "
                        "--keep-runs), training nothing")
    p.add_argument("--no-matched-baselines", action="store_true",
                   help="no wider-FFN baseline for the rows with more than 2%% extra parameters")
    args = p.parse_args(argv)
    try:
        launcher = runner.launcher_from_args(args, os.path.join(args.out_dir, "submitit"),
                                             runner.shared_cores(args.jobs))
        chosen = choose(args)
        # a recipe not chosen yet is tried on the baseline alone (the tests' scale runs all)
        only = {row: tuple(t for t in args.tasks if runs_in(t, chosen[t][0], row))
                for row in args.rows if row != BASELINE}
        comparison = runner.Comparison(
            "encdec", [row_of(row) for row in args.rows], args.tasks,
            args.seeds, BASELINE if BASELINE in args.rows else args.rows[0], only=only)
        comparison.check(lambda row, task: build_model(task, chosen[task][0], row,
                                                       chosen[task][1]))
        matched = {} if args.no_matched_baselines else add_matched_baselines(comparison,
                                                                             chosen)
        plan = comparison.plan(args.out_dir)
        recipes = {run.key: recipe_of(run.setting, chosen[run.setting][0], run.row,
                                      chosen[run.setting][1]) for run in plan}
        for run in plan:  # a finished run of another recipe: refused before anything trains
            runs.load_result(run.run_dir, recipes[run.key])
            if args.keep_runs:
                runs.load_result(kept_dir(args.keep_runs, run), recipes[run.key])
    except (runner.PlanError, runs.StepError) as error:
        p.error(str(error))
    names = {t: n for t, (n, _) in chosen.items()}

    def finished(run):
        """The run's result where it finished (here or kept), else None."""
        return runs.synced_result(run.run_dir, kept_dir(args.keep_runs, run), recipes[run.key],
                                  kept_files)
    if args.report_only:  # the runs finished so far, each row over the seeds it has
        results = {run.key: finished(run) for run in plan}
        done = [run for run in plan if results[run.key] is not None]
        print(f"[encdec] report of {len(done)} of {len(plan)} runs", flush=True)
        write_report(args, summarise(args, done, results, names, matched))
        return 0
    # one instance per output folder: a second would train the same runs, and its runs'
    # threads would be sized for a machine it shares (two 2-thread runs on 2 cores: a COGS
    # validation took ~12 minutes where it takes about one)
    os.makedirs(args.out_dir, exist_ok=True)
    lock = runs.exclusive_lock(os.path.join(args.out_dir, ".lock"))
    if lock is None:
        p.error(f"another encdec_comparison.py is training into {args.out_dir} (wait for it, "
                "stop it, or use another --out-dir)")
    print(f"[encdec] {len(plan)} runs ({', '.join(f'{t}: {n}' for t, n in names.items())}"
          f"), {args.jobs} at a time ({args.launcher}), {launcher.cpus} thread(s) each",
          flush=True)
    waiting = [t for t in args.tasks if chosen[t][0] not in (CHOSEN[t], TEST_RECIPE)]
    if waiting and len(args.rows) > 1:
        print(f"[encdec] {', '.join(waiting)}: recipe not chosen yet, the baseline alone runs "
              "(the other rows wait for CHOSEN)", flush=True)

    def report_run(run, result):
        tests = ", ".join(f"{label} {entry[TASKS[run.setting].metric]}"
                          for label, entry in result["tests"].items())
        print(f"[encdec] {run.setting} {run.row.name} seed {run.seed}: {tests}", flush=True)
    try:
        results = runner.launch(plan, work, (recipes, args.keep_runs), launcher,
                                on_result=report_run, done=finished)
    except runner.RunFailed as error:
        raise SystemExit(f"encdec_comparison: {error}") from None
    report = summarise(args, plan, results, names, matched)
    write_report(args, report)
    lock.close()
    return 0


def add_matched_baselines(comparison, chosen) -> Dict[str, Dict[str, str]]:
    """The runner's matched baselines (wider FFN in both stacks) under each task's recipe
    (``chosen``: {task: (recipe, data)}) -> {task: {row: its matched baseline's name}}."""
    return runner.add_matched_baselines(
        comparison, lambda row, task: parameters(task, chosen[task][0], row, chosen[task][1]),
        lambda task, target: matched_baseline(task, chosen[task][0], chosen[task][1], target),
        MATCH_ABOVE)


def work(run, recipes, keep_runs=None):
    """The runner's work: the run with its own recipe (and its kept folder)."""
    return run_work(run, recipes[run.key], kept_dir(keep_runs, run))


def _tests(metric, own, own_seeds, other, other_seeds, prefix):
    """{prefix: the hierarchical bootstrap, prefix_paired: the seed-paired one where both sides
    have the same seeds}."""
    out = {prefix: significance.hierarchical_bootstrap(metric, own, other)}
    if own_seeds == other_seeds:
        out[prefix + "_paired"] = significance.paired_hierarchical_bootstrap(metric, own, other)
    return out


def summarise(args, plan, results, names, matched=None) -> dict:
    """Per task and test subset: each row's mean, seeds, difference to the baseline (both
    tests) and to its matched baseline where it has one, parameters and CPU time ratio
    (seed-paired, on one machine: ``cpu_ratios``); COGS's categories. ``matched``: {task:
    {row: its matched baseline}}."""
    import numpy as np

    out = {"date": datetime.date.today().isoformat(), "recipes": names,
           "command": "python scripts/experiments/encdec_comparison.py "
                      + " ".join(map(shlex.quote, sys.argv[1:])),
           "package_version": runs.package_version(), "tasks": {}}
    ranked_tables = {}  # {task: its RANKED subset's table}, in the command's order
    for task in args.tasks:
        spec = TASKS[task]
        declared = {run.row.name: run.row for run in plan if run.setting == task}
        bench, bench_file, stale = bench_ratios(task, names[task], declared)
        if bench_file:
            out.setdefault("bench", {})[task] = bench_file
        if stale:
            out.setdefault("bench_stale", {})[task] = stale
        rows, diverged = {}, {}
        for run in plan:
            if run.setting == task:
                # a diverged run is reported as such, and left out of its row's numbers
                kept = diverged if results[run.key].get("diverged") else rows
                kept.setdefault(run.row.name, []).append(run)
        entry = {}
        for label in spec.tests:
            # every run's per-sentence statistics, read once (a row's are compared with the
            # baseline's and with its matched baseline's)
            stats = {row: [np.load(os.path.join(r.run_dir, f"test_stats_{label}.npy"))
                           for r in row_runs] for row, row_runs in rows.items()}
            table = {}
            base = stats.get(BASELINE)
            base_runs = {r.seed: results[r.key] for r in rows.get(BASELINE, [])}
            base_by_seed = {r.seed: results[r.key]["tests"][label][spec.metric]
                            for r in rows.get(BASELINE, [])}
            for row, row_runs in rows.items():
                values = [results[r.key]["tests"][label][spec.metric] for r in row_runs]
                mean, std = mean_std(values)
                last_valid = [v for v in (last_validation(results[r.key], label, spec)
                                          for r in row_runs) if v is not None]
                item = {"seeds": [r.seed for r in row_runs], "values": values,
                        "mean": round(mean, 2), "std": round(std, 2),
                        "params": results[row_runs[0].key]["params"]}
                if len(last_valid) == len(row_runs):
                    item["valid_last"] = round(statistics.mean(last_valid), 2)
                if row != BASELINE:
                    # each seed against the baseline's run of the same seed (same data order)
                    item["by_seed"] = {r.seed: round(v - base_by_seed[r.seed], 2)
                                       for r, v in zip(row_runs, values) if r.seed in base_by_seed}
                ratios = cpu_ratios({r.seed: results[r.key] for r in row_runs}, base_runs)
                if ratios:
                    item["cpu_ratio"] = round(statistics.mean(ratios.values()), 2)
                    item["cpu_ratio_seeds"] = sorted(ratios)
                for measure in ("train_time_ratio", "memory_growth_ratio"):
                    if bench.get(row, {}).get(measure) is not None:
                        item[measure] = bench[row][measure]
                seeds = [r.seed for r in row_runs]
                if base is not None and row != BASELINE:
                    item.update(_tests(spec.metric, stats[row], seeds, base,
                                       [r.seed for r in rows[BASELINE]], "vs_baseline"))
                match = (matched or {}).get(task, {}).get(row)
                if match in rows:
                    item["matched"] = match
                    item.update(_tests(spec.metric, stats[row], seeds, stats[match],
                                       [r.seed for r in rows[match]], "vs_matched"))
                per_category = [results[r.key]["tests"][label].get("per_category")
                                for r in row_runs]
                if all(per_category):
                    categories = sorted(per_category[0])
                    item["per_category"] = {c: round(statistics.mean(p[c] for p in per_category),
                                                     2) for c in categories}
                    structural = [c for c in categories if c in COGS_STRUCTURAL]
                    lexical = [c for c in categories if c not in COGS_STRUCTURAL]
                    item["lexical"] = round(statistics.mean(item["per_category"][c]
                                                            for c in lexical), 2)
                    if structural:
                        item["structural"] = round(statistics.mean(item["per_category"][c]
                                                                   for c in structural), 2)
                table[row] = item
            for row, row_runs in diverged.items():
                table.setdefault(row, {"seeds": [], "values": [], "params": None})[
                    "diverged"] = [r.seed for r in row_runs]
            entry[label] = table
        out["tasks"][task] = entry
        # the runs' own CPU accounts summed (diverged ones too: they spent it), the figure the
        # issue's core-hour budget is measured against
        spent = [results[run.key].get("train_cpu_seconds") for run in plan
                 if run.setting == task]
        out.setdefault("cpu_hours", {})[task] = {
            "runs": len(spent), "core_hours": round(sum(s for s in spent if s) / 3600, 1),
            "unaccounted": sum(1 for s in spent if s is None),
            "machines": runs.machines_used(results[run.key] for run in plan
                                           if run.setting == task)[0]}
        out.setdefault("fit", {})[task] = fit_table(rows, results)
        out.setdefault("curves", {})[task] = curve_deltas(
            rows, results, {"valid": "valid_curve", **{label: ("curves", label)
                                                      for label in spec.curves}})
        ranked = entry.get(RANKED.get(task))
        if ranked:
            out.setdefault("against_lm", {})[task] = ranking_against_lm(ranked)
            ranked_tables[task] = ranked
    tasks = list(ranked_tables)
    for i, first in enumerate(tasks):  # each pair of tasks once
        for second in tasks[i + 1:]:
            out.setdefault("between_tasks", {})[f"{first}/{second}"] = ranking_between_tasks(
                {first: ranked_tables[first], second: ranked_tables[second]})
    return out


def machine_of(result) -> Optional[str]:
    """The one machine a run trained on (its ``machines`` record), None where it trained on
    several (resumed elsewhere). A run without the record is of ``UNRECORDED_MACHINE``."""
    machines = result.get("machines") or [None]
    return None if len(machines) > 1 else (machines[0] or UNRECORDED_MACHINE)


def cpu_ratios(row_runs: Dict[int, dict], base_runs: Dict[int, dict]) -> Dict[int, float]:
    """{seed: the run's CPU seconds over the baseline's of the same seed}, for the seeds where
    both have a complete account and trained on one and the same machine (``machine_of``):
    a run's CPU time is its machine's, and the machines this comparison's runs land on differ
    in speed. ``row_runs``, ``base_runs``: {seed: result}."""
    ratios = {}
    for seed, result in row_runs.items():
        base = base_runs.get(seed)
        if base is None or result.get("train_cpu_seconds") is None \
                or base.get("train_cpu_seconds") is None:
            continue
        here = machine_of(result)
        if here is not None and here == machine_of(base):
            ratios[seed] = result["train_cpu_seconds"] / base["train_cpu_seconds"]
    return ratios


def fit_table(rows: Dict[str, List[runner.Run]], results) -> Dict[str, dict]:
    """{row: {'train', 'valid', 'gap', and each further validated subset}}: the last epoch's
    training and validation cross-entropy (bits per target token, means over the row's runs),
    their difference, and the other validated subsets' (COGS's gen_dev), for the rows whose
    every run recorded them (``last_nll``; runs finished before it was kept have none): a row
    ahead on training and behind on validation fits its training data more closely than the
    baseline and generalises less."""
    table = {}
    for row, row_runs in rows.items():
        fits = [results[r.key].get("last_nll") or {} for r in row_runs]
        kinds = [k for k in fits[0] if all(f.get(k) is not None for f in fits)]
        if "train" in kinds and "valid" in kinds:
            item = {k: round(statistics.mean(f[k] for f in fits), 3) for k in kinds}
            item["gap"] = round(statistics.mean(f["valid"] - f["train"] for f in fits), 3)
            table[row] = item
    return table


def last_validation(result: dict, label: str, task: Task) -> Optional[float]:
    """A run's last validation score (greedy): of the tested subset ``label`` where ``task``
    validates it (its ``curves``: COGS's gen_dev), else of its validation subset; None where
    that curve is empty."""
    curve = ((result.get("curves") or {}).get(label) if label in task.curves
             else result["valid_curve"])
    return curve[-1][1] if curve else None


def bench_ratios(task, recipe, rows: Dict[str, runner.Row], pattern=None
                 ) -> Tuple[Dict[str, dict], Optional[str], List[str]]:
    """({row: its ratios to the baseline}, the file, [rows it measured with other flags]) from
    the task's benchmark where it measured ``recipe`` at full size; ({}, None, []) where there
    is none (a quick run's figures are not measurements). A row's ratios are kept only where
    the benchmark built the model ``rows`` declares (its architecture and every flag), so that a
    row whose flags changed after its benchmark shows none rather than another model's."""
    path = (pattern or BENCH).format(task=task)
    if not os.path.exists(os.path.join(paths.REPO, path)):
        return {}, None, []
    with open(os.path.join(paths.REPO, path)) as f:
        bench = json.load(f)
    if bench.get("recipe") != recipe or bench.get("quick"):
        return {}, None, []
    models = bench.get("models", {})
    ratios, stale = {}, []
    for name, measured in bench["ratios_vs_baseline"].items():
        if name not in rows:
            continue
        if models.get(name) == [rows[name].arch, model_flags(task, recipe, rows[name])]:
            ratios[name] = measured
        else:
            stale.append(name)
    return ratios, path, sorted(stale)


def curve_deltas(rows, results, curves) -> dict:
    """{curve label: {row: (updates, mean, low, high)}}: each row's learning curve minus the
    baseline's of the same seed (the same data order), its mean and range over the seeds both
    have, at the updates every one of them has; ``curves``: {label: where a result keeps it
    (a key, or a (key, label) pair)}. The baseline's own curve (mean over its seeds) is kept
    under the label ``<label>_baseline``."""
    def curve(run, where):
        value = results[run.key]
        for key in (where if isinstance(where, tuple) else (where,)):
            value = (value or {}).get(key)
        return {int(u): v for u, v in value or []}
    base = {r.seed: r for r in rows.get(BASELINE, [])}
    out = {}
    for label, where in curves.items():
        if base:
            own = [curve(r, where) for r in base.values()]
            updates = sorted(set.intersection(*(set(c) for c in own)))
            if updates:
                out[f"{label}_baseline"] = (updates, [round(statistics.mean(c[u] for c in own),
                                                            2) for u in updates])
        deltas = {}
        for row, row_runs in rows.items():
            paired = [(curve(r, where), curve(base[r.seed], where)) for r in row_runs
                      if row != BASELINE and r.seed in base]
            if not paired:
                continue
            updates = sorted(set.intersection(*(set(a) & set(b) for a, b in paired)))
            if not updates:
                continue
            diffs = [[a[u] - b[u] for a, b in paired] for u in updates]
            deltas[row] = (updates, [round(statistics.mean(d), 3) for d in diffs],
                           [round(min(d), 3) for d in diffs], [round(max(d), 3) for d in diffs])
        out[label] = deltas
    return out


def ranks(gains: Dict[str, float]) -> Dict[str, float]:
    """{row: its rank by gain} (1: the largest; average ranks for ties), in ``gains``' order."""
    from scipy.stats import rankdata

    return dict(zip(gains, map(float, rankdata([-g for g in gains.values()]))))


def ranking_against_lm(table, lm_report=LM_REPORT) -> Optional[dict]:
    """The shared rows (LM_ROWS) ranked by their gain over the baseline here (``table``: one
    test subset's rows) and in the WikiText-2 comparison (its difference in test bits at
    LM_DEPTH blocks, negated: fewer bits is the gain), how many seeds each gain is a mean
    over (the two comparisons finish rows at different times), and Spearman's rank
    correlation of the two rankings (average ranks for ties; None below three shared rows or
    without the LM's report)."""
    from scipy.stats import spearmanr

    if not os.path.exists(lm_report):
        return None
    with open(lm_report) as f:
        lm = json.load(f)["depths"].get(LM_DEPTH, {})
    shared = [row for row in table if row in LM_ROWS and "vs_baseline" in table[row]
              and "vs_baseline" in lm.get(LM_ROWS[row], {})]
    if len(shared) < 3:
        return None
    here = [table[row]["vs_baseline"]["difference"] for row in shared]
    there = [-lm[LM_ROWS[row]]["vs_baseline"]["difference"] for row in shared]
    rho = spearmanr(here, there).statistic
    return {"rows": shared, "lm_report": lm_report, "lm_depth": int(LM_DEPTH),
            "gain": dict(zip(shared, here)), "lm_gain_bits": dict(zip(shared, there)),
            "rank": ranks(dict(zip(shared, here))), "lm_rank": ranks(dict(zip(shared, there))),
            "seeds": {row: len(table[row].get("seeds", [])) for row in shared},
            "lm_seeds": {row: len(lm[LM_ROWS[row]].get("seeds", [])) for row in shared},
            "spearman": round(float(rho), 3)}


def ranking_between_tasks(tables: Dict[str, dict]) -> Optional[dict]:
    """Two tasks' tables (``{task: its RANKED subset's rows}``): the rows both have with a
    difference from the baseline (the matched baselines among them), ranked on each by their
    gain (rank 1: the largest; average ranks for ties), how many seeds each gain is a mean
    over, and Spearman's rank correlation of the two rankings: does what helps one task help
    the other? None below three shared rows."""
    from scipy.stats import spearmanr

    first, second = tables
    shared = [row for row in tables[first] if "vs_baseline" in tables[first][row]
              and "vs_baseline" in tables[second].get(row, {})]
    if len(shared) < 3:
        return None
    gain = {task: {row: tables[task][row]["vs_baseline"]["difference"] for row in shared}
            for task in tables}
    return {"tasks": [first, second], "rows": shared, "gain": gain,
            "rank": {task: ranks(gain[task]) for task in tables},
            "seeds": {task: {row: len(tables[task][row].get("seeds", [])) for row in shared}
                      for task in tables},
            "spearman": round(float(spearmanr(list(gain[first].values()),
                                              list(gain[second].values())).statistic), 3)}


def group_table(table) -> List[str]:
    """Markdown lines: each row's exact match % on COGS's lexical and structural categories
    (means over its seeds; one decimal, as the per-category table; — where it has none)."""
    def cell(item, group):
        return f"{item[group]:.1f}" if group in item else "—"
    return ["| row | lexical | structural |", "|---|---:|---:|"] + [
        f"| {row} | {cell(item, 'lexical')} | {cell(item, 'structural')} |"
        for row, item in table.items()]


def category_table(table) -> List[str]:
    """Markdown lines: one line per generalisation category (structural ones marked), the
    baseline's exact match and every other row's difference from it (means over seeds; the
    rows without per-category scores are left out)."""
    rows = [row for row, item in table.items() if "per_category" in item]
    if BASELINE not in rows:
        return []
    others = [row for row in rows if row != BASELINE]
    base = table[BASELINE]["per_category"]
    lines = ["Per category (the baseline's exact match %, the other rows' Δ from it):", "",
             "| category | " + " | ".join([BASELINE] + others) + " |",
             "|---|" + "---:|" * (1 + len(others))]
    for category in sorted(base, key=lambda c: (c in COGS_STRUCTURAL, c)):
        mark = " (structural)" if category in COGS_STRUCTURAL else ""
        cells = [f"{base[category]:.1f}"] + [
            f"{table[row]['per_category'][category] - base[category]:+.1f}"
            if category in table[row]["per_category"] else "—" for row in others]
        lines.append(f"| {category}{mark} | " + " | ".join(cells) + " |")
    return lines


def markdown(report) -> str:
    lines = [f"Command: `{report['command']}` ({report['package_version']}, {report['date']}); "
             f"recipes: {', '.join(f'{t} {n}' for t, n in report['recipes'].items())}.", ""]
    for task, tests in report["tasks"].items():
        metric = "BLEU" if TASKS[task].metric == "bleu" else "exact match %"
        for label, table in tests.items():
            lines += [f"### {task}, {label} ({metric})", "",
                      "| row | seeds | params | last valid | test | Δ vs baseline [95%] | "
                      "beyond noise | Δ by seed | paired over seeds [95%] | beyond noise "
                      "(paired) | Δ vs matched baseline [95%] | training time | memory | "
                      "runs' CPU time |",
                      "|---|---|---:|---:|---:|---:|:-:|---:|---:|:-:|---|---:|---:|---:|"]
            base_seeds = len(table.get(BASELINE, {}).get("values", ()))
            for row, item in table.items():
                seeds = min(len(item["values"]), base_seeds)
                gone = (f" (diverged: seed {', '.join(map(str, item['diverged']))})"
                        if item.get("diverged") else "")
                if not item["values"]:
                    lines.append(f"| {row}{gone} |" + " — |" * 13)
                    continue

                def cell(test):
                    return (f"{test['difference']:+.2f} [{test['low']:+.2f}, "
                            f"{test['high']:+.2f}]" if test else "—")

                def verdict(test):
                    if not test:
                        return "—"
                    if seeds < VERDICT_SEEDS:
                        return f"not judged ({seeds} seed{'s' if seeds > 1 else ''})"
                    return "yes" if test["larger_than_noise"] else "no"
                by_seed = item.get("by_seed") or {}
                matched = (f"{item['matched']}: {cell(item.get('vs_matched'))}"
                           + (" *" if item.get("vs_matched", {}).get("larger_than_noise")
                              and seeds >= VERDICT_SEEDS else "")
                           if "matched" in item else "—")
                lines.append(
                    f"| {row}{gone} | {','.join(map(str, item['seeds']))} | "
                    f"{item['params']:,} | {item.get('valid_last', '—')} | "
                    f"{fmt(item['mean'], item['std'])} | {cell(item.get('vs_baseline'))} | "
                    f"{verdict(item.get('vs_baseline'))} | "
                    + (" / ".join(f"{d:+.2f}" for d in by_seed.values()) or "—") + " | "
                    f"{cell(item.get('vs_baseline_paired'))} | "
                    f"{verdict(item.get('vs_baseline_paired'))} | {matched} | "
                    f"{item.get('train_time_ratio', '—')} | "
                    f"{item.get('memory_growth_ratio', '—')} | {cpu_cell(item)} |")
            if any("per_category" in item for item in table.values()):
                lines += [""] + group_table(table) + [""] + category_table(table)
            lines.append("")
    for task, ranking in report.get("against_lm", {}).items():
        if not ranking:
            continue
        lines += [f"### {task} against the WikiText-2 comparison", "",
                  f"The rows both comparisons have, ranked by their gain over the baseline "
                  f"(1: the largest): here on {RANKED[task]}, there in test bits at "
                  f"{ranking['lm_depth']} blocks ({ranking['lm_report']}). Spearman's rank "
                  f"correlation: {ranking['spearman']:+.2f} over {len(ranking['rows'])} rows. "
                  f"Seeds: how many seeds each gain is a mean over (the baseline's are those "
                  f"of its own row).",
                  "", "| row | gain here | seeds | rank | gain there (bits) | seeds | rank |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        # reports written before the seed counts were kept show — there
        seeds, lm_seeds = ranking.get("seeds", {}), ranking.get("lm_seeds", {})
        for row in sorted(ranking["rows"], key=lambda r: ranking["rank"][r]):
            lines.append(f"| {row} | {ranking['gain'][row]:+.2f} | {seeds.get(row, '—')} | "
                         f"{ranking['rank'][row]:g} | {ranking['lm_gain_bits'][row]:+.4f} | "
                         f"{lm_seeds.get(row, '—')} | {ranking['lm_rank'][row]:g} |")
        lines.append("")
    for ranking in report.get("between_tasks", {}).values():
        if not ranking:
            continue
        first, second = ranking["tasks"]
        units = {task: "BLEU" if TASKS[task].metric == "bleu" else "points"
                 for task in (first, second)}
        lines += [f"### {first} against {second}", "",
                  f"The rows both tasks have, ranked by their gain over the baseline (1: the "
                  f"largest): on {first}'s {RANKED[first]} and on {second}'s {RANKED[second]}. "
                  f"Spearman's rank correlation: {ranking['spearman']:+.2f} over "
                  f"{len(ranking['rows'])} rows.", "",
                  f"| row | {first} gain ({units[first]}) | seeds | rank | {second} gain "
                  f"({units[second]}) | seeds | rank |", "|---|---:|---:|---:|---:|---:|---:|"]
        for row in sorted(ranking["rows"], key=lambda r: ranking["rank"][first][r]):
            lines.append(" | ".join(
                [f"| {row}"] + [f"{ranking['gain'][t][row]:+.2f} | {ranking['seeds'][t][row]} | "
                                f"{ranking['rank'][t][row]:g}" for t in (first, second)]) + " |")
        lines.append("")
    for task, fits in report.get("fit", {}).items():
        if not fits:
            continue
        base = fits.get(BASELINE) or {}
        # the validated subsets beyond train and valid (COGS's gen_dev), as the first row has
        # them (a row without one shows —)
        extra = [k for k in next(iter(fits.values())) if k not in ("train", "valid", "gap")]
        columns = ["train", "valid", "gap", *extra]
        lines += [f"### {task}, fit at the last epoch", "",
                  "Cross-entropy in bits per target token, means over the row's seeds: train "
                  "is the last epoch's mean with dropout on (as fairseq logs it), valid the "
                  "last validation's" + "".join(f", {k} the last validation of {k}"
                                                 for k in extra)
                  + "; gap = valid − train; Δ from the baseline's.", "",
                  "| row | " + " | ".join(columns) + " | "
                  + " | ".join(f"Δ {k}" for k in ("train", "valid", *extra)) + " |",
                  "|---|" + "---:|" * (len(columns) + 2 + len(extra))]
        for row, fit in fits.items():
            delta = [f"{fit[k] - base[k]:+.3f}" if row != BASELINE and k in base and k in fit
                     else "—" for k in ("train", "valid", *extra)]
            lines.append(f"| {row} | " + " | ".join(
                f"{fit[k]:.3f}" if k in fit else "—" for k in columns)
                + " | " + " | ".join(delta) + " |")
        lines.append("")
    spent = report.get("cpu_hours", {})
    if spent:
        lines += ["The runs' CPU time so far (training and validation, their processes' "
                  "accounts; the test generation is not counted): " + "; ".join(
                      f"{task} {item['core_hours']:g} core-hours over {item['runs']} "
                      f"run{'s' if item['runs'] != 1 else ''}"
                      + (f" ({item['unaccounted']} without an account)"
                         if item["unaccounted"] else "")
                      for task, item in spent.items())
                  + f"; {sum(item['core_hours'] for item in spent.values()):.1f} in all.", ""]
        # reports written before the machines were recorded have no counts
        by_machine = [f"{task}'s runs by machine (the CPU, the instruction set PyTorch's "
                      f"kernels use, PyTorch): {runs.machine_counts(item['machines'])}."
                      for task, item in spent.items() if item.get("machines")]
        lines += by_machine + ([""] if by_machine else [])
    for task, curves in report.get("curves", {}).items():
        for label in [k for k in curves if k.endswith("_baseline")]:
            updates, values = curves[label]
            lines += [f"{task}, the baseline's {label[:-len('_baseline')]} curve (mean over "
                      "its seeds): " + ", ".join(f"{v:g} at {u}" for u, v in
                                                 zip(updates, values)) + ".", ""]
    lines.append(f"Test: mean ± sample std over the row's seeds; last valid: the last "
                 "validation's score (greedy; of the tested subset where the runs validate it, "
                 "as gen_dev, else of the validation subset), mean over the seeds. Beyond "
                 f"noise: the 95% interval excludes 0, judged only with {VERDICT_SEEDS} seeds or "
                 "more on both sides (\\* on a matched baseline's Δ). Δ: row minus baseline, "
                 "means over seeds of the unrounded corpus scores; Δ by seed: each seed's score "
                 "as stored (two decimals) against the baseline's same seed, so the two may "
                 "differ in the last digit; the hierarchical bootstrap resamples test sentences "
                 "and each row's seeds, the paired one the per-seed differences "
                 "(layerlab/significance.py). Training time and memory "
                 "ratios: the benchmark suite at the recipe's size ("
                 + (", ".join(report["bench"].values()) if report.get("bench") else
                    "not benchmarked: —")
                 + "; scripts/bench/encdec.py"
                 + "".join(f"; {task}'s {', '.join(rows)} measured there with other flags than "
                           "the runs': —" for task, rows in report.get("bench_stale", {}).items())
                 + "), training time per update and the peak "
                 "memory growth of training against the baseline's. The runs' CPU time: each "
                 "run's processes' accounts (training and validation) over the baseline's run "
                 "of the same seed where both trained on the same machine, mean over those "
                 "seeds (named where they are fewer than the row's; — where there is none), "
                 "not a benchmark: machines differ in speed. The runs whose machine is not "
                 "recorded (finished before the record was kept) trained on one machine and "
                 "are compared with each other.")
    return "\n".join(lines) + "\n"


def cpu_cell(item) -> str:
    """The CPU time column: the ratio, with the seeds it is over where they are fewer than the
    row's (reports written before ``cpu_ratio_seeds`` was kept: every seed)."""
    if "cpu_ratio" not in item:
        return "—"
    seeds = item.get("cpu_ratio_seeds", item["seeds"])
    if len(seeds) == len(item["seeds"]):
        return f"{item['cpu_ratio']}"
    return f"{item['cpu_ratio']} (seed{'s' * (len(seeds) > 1)} {','.join(map(str, seeds))})"


def write_report(args, report):
    text = markdown(report)
    os.makedirs(args.out_dir, exist_ok=True)
    targets = [os.path.join(args.out_dir, "results")]
    if args.results_name:
        targets.append(os.path.join(paths.RESULTS, args.results_name))
    for target in targets:
        with open(target + ".json", "w") as f:
            json.dump(report, f, indent=2)
        with open(target + ".md", "w") as f:
            f.write(text)
        curves_figure(report, target + "_curves.png")
    print(text)


def curves_figure(report, out) -> bool:
    """One panel per task and validation curve: each row's difference from the baseline over
    the updates (mean over seeds, their range as a band)."""
    from layerlab import figures

    panels = [(f"{task}: {label} ({'BLEU' if TASKS[task].metric == 'bleu' else 'exact match %'})",
               {row: tuple(v) for row, v in rows.items()})
              for task, curves in report.get("curves", {}).items()
              for label, rows in curves.items() if not label.endswith("_baseline")]
    return figures.curve_differences(panels, out, ylabel="Δ vs the baseline")


if __name__ == "__main__":
    sys.exit(main())
