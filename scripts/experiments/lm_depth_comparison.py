#!/usr/bin/env python3
"""The seeded language-modelling comparison of the depth connections (docs/ideas/comparison.md).

    python scripts/experiments/lm_depth_comparison.py [--data data-bin/wikitext-2]
        [--out-dir outputs/lm-depth] [--rows baseline,dwa,...] [--depths 4,12] [--seeds 1,2,3]
        [--updates 800] [--embed-dim 128] [--jobs 1] [--launcher local|slurm|debug]

Every row is ``gpt_baseline_lm`` (or ``ar_encdec_lm`` with the same total number of blocks) at
d = 128, 4 heads, trained with one recipe (context 128, batch 16, ``--updates`` updates of Adam,
inverse-sqrt schedule), at every depth and seed. Each run is scored per test block (its negative
log-likelihood in bits and its tokens, blocks of the context length, as ``fairseq-eval-lm``
scores them), so that the comparison with the baseline is the hierarchical bootstrap of
``layerlab.significance`` over test blocks and seeds together. A row whose parameters exceed the
baseline's by more than 2% gets a matched-parameter baseline (the baseline with a wider FFN,
``baseline_ffn<F>``) at that depth.

The first seed of every row is also analysed (``scripts/analyze_layers.py`` on 256 validation
blocks: CKA across depth, logit lens, sub-layer update norms, the learned connection weights) into
``analysis/`` of its run folder; the Hyper-Connections and mHC rows log the Amax gain of their
composite stream mixing, kept as the last logged value. Checkpoints are deleted once scored.

Resumable: a finished run (``result.json`` in its folder) is skipped when the script runs again;
an unfinished one continues from its last checkpoint (one every ``--save-interval-updates``
updates, 100 by default) when it has one of the same recipe, else starts again from scratch.
``--keep-runs DIR`` also copies each finished run's ``result.json``, ``test_blocks.npy`` and (first
seed) ``analysis/analysis.json`` to DIR, and takes a finished run from there when the output
folder lacks it: the output folder is scratch space (checkpoints, logs), lost with the machine;
DIR is committed (``results/lm_depth_runs``), so that a fresh clone resumes where the last
commit left off and rewrites the tables from it.
The comparison is a declaration run by the experiment runner (``layerlab.runner``: the
depths are its settings; plan, matched baselines, submitit's launchers): ``--launcher local``
(this machine, ``--jobs`` at a time), ``slurm`` (one job per run, ``--slurm-partition``,
``--gpus-per-run``, ``--time-limit``) or ``debug`` (in this process).
Runs go seed by seed within a depth (every row at seed 1, then at seed 2, ...), and
``--report-only`` writes the tables of the runs finished so far (each row over the seeds it has)
without training anything. ``--jobs N`` trains N runs at once, each with the machine's cores / N
threads unless ``--threads`` says otherwise (on 2 cores two 1-thread runs do ~13% more updates
per second than one 2-thread run: a d = 128 model does not keep two threads busy); a second
instance training into the same ``--out-dir`` or keeping into the same ``--keep-runs`` is
refused (it would train the same runs, its threads sized for the machine alone). Bad input (an
unknown row, a missing data folder, a data folder whose dictionary differs from the one the
output or kept runs' folder was started with) stops with one line before anything trains. Writes ``results.{json,md}`` into ``--out-dir``;
``--results-name NAME`` also copies them to ``results/NAME.{json,md}``.

Data: ``python scripts/prepare/lm.py --dataset wikitext-2 --from ../shared/data/wikitext-2``
(``data-bin/wikitext-2``, SentencePiece 8000).
"""
import argparse
import hashlib
import json
import logging
import math
import os
import re
import shutil
import sys
import time

import numpy as np

from layerlab import fairseq_log, figures, paths, recipes, runner, runs, significance, stats

# fairseq's text_to_speech task calls logging.basicConfig(level=INFO) when fairseq is imported;
# configuring logging first keeps the progress lines readable
logging.basicConfig(level=logging.WARNING, format="%(message)s")

BASELINE = "baseline"
# row -> (architecture, flags); ar_encdec_lm rows use half the blocks per stack (same total)
ROWS = {
    BASELINE: ("gpt_baseline_lm", []),
    "dwa": ("gpt_baseline_lm", ["--decoder-fusion", "--fusion-kind", "dwa"]),
    "lrf": ("gpt_baseline_lm", ["--decoder-fusion"]),
    "lrf_all_positions": ("gpt_baseline_lm", ["--decoder-fusion", "--fusion-reading",
                                              "all-positions"]),
    # --log-layer-weights: the Amax gain of the composite stream mixing in the training log
    "hc_static": ("gpt_baseline_lm", ["--hyper-connections", "static", "--log-layer-weights"]),
    "hc_dynamic": ("gpt_baseline_lm", ["--hyper-connections", "dynamic", "--log-layer-weights"]),
    "mhc": ("gpt_baseline_lm", ["--mhc", "sinkhorn", "--log-layer-weights"]),
    "mhc_lite": ("gpt_baseline_lm", ["--mhc", "lite", "--log-layer-weights"]),
    "frac_connections": ("gpt_baseline_lm", ["--frac-connections", "dynamic"]),
    "attn_res_full": ("gpt_baseline_lm", ["--attn-res", "full"]),
    "attn_res_block": ("gpt_baseline_lm", ["--attn-res", "block", "--attn-res-blocks", "2"]),
    "mudd": ("gpt_baseline_lm", ["--mudd"]),
    "value_residual": ("gpt_baseline_lm", ["--value-residual", "learnable"]),
    # LAuReL (docs/ideas/laurel.md): the paper's LLM setting (RW+LR) and PA (k = 3), r = 4, 3%
    # of the width: under the 2% parameter threshold at 4 and 8 blocks
    "laurel_rw_lr": ("gpt_baseline_lm", ["--laurel", "rw_lr", "--laurel-rank", "4"]),
    "laurel_pa": ("gpt_baseline_lm", ["--laurel", "pa", "--laurel-rank", "4"]),
    "ar_encdec": ("ar_encdec_lm", []),
    "ar_encdec_bridge": ("ar_encdec_lm", ["--bridge", "fc"]),
    "ar_encdec_transparent": ("ar_encdec_lm", ["--bridge", "transparent"]),
    "ar_encdec_embedding_loss": ("ar_encdec_lm", ["--criterion", "lm_embedding_loss",
                                                  "--embedding-loss", "mse"]),
}
# the rows of scripts/bench/depth.py that measure a row's time and memory
BENCH_ROWS = {BASELINE: "plain", "dwa": "dwa", "lrf": "lrf",
              "lrf_all_positions": "lrf_all_positions", "hc_static": "hc_static_n4",
              "hc_dynamic": "hc_dynamic_n4", "mhc": "mhc_n4", "mhc_lite": "mhc_lite_n4",
              "frac_connections": "frac_dynamic_m4", "attn_res_full": "attn_res_full",
              "attn_res_block": "attn_res_block",
              "mudd": "mudd", "value_residual": "value_residual",
              "laurel_rw_lr": "laurel_rw_lr", "laurel_pa": "laurel_pa",
              **{row: row for row in ROWS if row.startswith("ar_encdec")}}
# the committed runs of it that hold them, per measure, one file per depth (4 and 12 blocks: the
# 800-update comparison; 8: the 8,000-update one's deeper depth), all at the comparison's own
# vocabulary and dropout (--vocab 8000: with the word-level 33k the output layer is most of a
# step and every overhead looks smaller; --dropout 0.1: dropout on an attention's weights costs
# in proportion to its keys). The time as the runs train: one thread, two processes at a time,
# the "retain" allocator settings. The peak memory under glibc's defaults: retained, freed pages
# stay mapped and the peak says what the allocator keeps, not what the step needs
# (docs/benchmarks.md, "Depth connections in the language model")
BENCH_DEPTHS = (4, 8, 12)
# (LAuReL's rows, added later, measured at 4 and 8 blocks beside the plain model in files of
# their own: every file's rows are read)
LAUREL_BENCH_DEPTHS = (4, 8)
BENCH_FILES = {
    "train_time_ratio": tuple(f"bench_depth_pieces_retain_d{d}_cpu.json" for d in BENCH_DEPTHS)
    + tuple(f"bench_depth_laurel_pieces_retain_d{d}_cpu.json" for d in LAUREL_BENCH_DEPTHS),
    "memory_growth_ratio": tuple(f"bench_depth_pieces_d{d}_cpu.json" for d in BENCH_DEPTHS)
    + tuple(f"bench_depth_laurel_pieces_d{d}_cpu.json" for d in LAUREL_BENCH_DEPTHS)}
# the suite's files, named by every report; the others only by a report with their rows
SUITE_BENCH_FILES = {f"bench_depth_pieces{kind}_d{d}_cpu.json" for d in BENCH_DEPTHS
                     for kind in ("", "_retain")}
# the fewest seeds on either side of a test that give a verdict: the three; with two, a
# bootstrap that resamples seeds draws the same seed twice half the time and sees half the seed
# variance (three: two thirds), so a 2-seed interval is too narrow to call anything beyond noise
VERDICT_SEEDS = 3
# what --keep-runs keeps of a finished run: all that the report and the figures read
KEPT_FILES = ("result.json", "test_blocks.npy", os.path.join("analysis", "analysis.json"))
# the test blocks at a curve point (--test-at), or the record that they could not be recovered
TEST_AT = re.compile(r"test_blocks_(\d+)\.(npy|mismatch\.json)")
STARTED = "started.json"  # an unfinished run's recipe (what a resumed run must match)
# the CPU seconds of each fairseq-train process of a run so far (a resumed run has several);
# null for a process that did not end normally (killed: its time is unknown), and no file for a
# run begun before the count was kept: then the run's count is incomplete (null in result.json)
CPU_SECONDS = "cpu_seconds.json"
MATCH_ABOVE = 0.02  # a row with more extra parameters than this gets a matched baseline
# a run's bits (its validation and test scores, its curve points) as result.json stores them;
# bootstrap results keep what significance.rounded gives (six decimals or more)
RUN_BITS_DIGITS = 5
# a learning curve's mean over seeds of runs' bits: six decimals hold a mean of one or two
# seeds exactly, and one of three exactly or with a sixth decimal of 3 or 7 (a third of 1e-5),
# never the 5 that a reading at four decimals would round again
CURVE_DIGITS = RUN_BITS_DIGITS + 1
HEADS, CONTEXT, BATCH = 4, 128, 16
# glibc's malloc settings for the training processes: with its defaults every tensor above the
# mmap threshold (the logits, their softmax and gradients) is mapped fresh and unmapped when
# freed, so each step page-faults it back in; retained, the same arithmetic runs faster
# (measured by scripts/bench/comparison_throughput.py: results/bench_comparison_throughput_cpu.md)
ALLOCATORS = {"default": {},
              "retain": {"MALLOC_MMAP_THRESHOLD_": "4294967296",
                         "MALLOC_TRIM_THRESHOLD_": "4294967296"}}


class InputError(Exception):
    """Bad input, found before anything trains."""


def parse_list(text, kind=str):
    return [kind(x) for x in text.split(",") if x]


def row_spec(name, depth, embed_dim):
    """(arch, model flags) of a row, matched baselines (``baseline_ffn<F>``) included."""
    if name.startswith(f"{BASELINE}_ffn"):
        return "gpt_baseline_lm", recipes.lm_sizes("gpt_baseline_lm", depth, embed_dim, HEADS,
                                                   int(name[len(BASELINE) + 4:]))
    arch, flags = ROWS[name]
    return arch, recipes.lm_sizes(arch, depth, embed_dim, HEADS) + flags


def recipe_flags(updates, warmup=None, log_interval=None):
    """The fairseq-train flags of the recipe (``warmup``, ``log_interval``: the defaults of
    ``recipes.lm_adam_inverse_sqrt`` when None)."""
    return recipes.lm_adam_inverse_sqrt(updates, CONTEXT, BATCH, warmup=warmup,
                                        log_interval=log_interval)


def args_recipe_flags(args):
    return recipe_flags(args.updates, args.warmup_updates, args.log_interval)


def parameters(arch, flags, dictionary):
    from fairseq_plugins.inprocess import build_language_model

    model, _, _ = build_language_model(arch, [*flags, "--tokens-per-sample", CONTEXT],
                                       dictionary)
    return sum(p.numel() for p in model.parameters())


def matched_ffn(target, depth, embed_dim, dictionary):
    """The FFN width whose baseline has the parameters closest to ``target`` (the count is
    linear in the width: ``runner.nearest_width``)."""
    return runner.nearest_width(
        lambda ffn: parameters("gpt_baseline_lm", recipes.lm_sizes(
            "gpt_baseline_lm", depth, embed_dim, HEADS, ffn), dictionary),
        4 * embed_dim, 8 * embed_dim, target)


def check_inputs(args):
    unknown = [r for r in args.rows if r not in ROWS]
    if unknown:
        raise InputError(f"unknown row(s) {', '.join(unknown)}; known: {', '.join(ROWS)}")
    if BASELINE not in args.rows:
        raise InputError(f"the rows must include {BASELINE} (every row is compared with it)")
    if args.save_interval_updates < 0:
        raise InputError(f"--save-interval-updates {args.save_interval_updates}: a number of "
                         "updates, or 0 for no checkpoint before the end")
    if args.warmup_updates is not None and not 1 <= args.warmup_updates <= args.updates:
        raise InputError(f"--warmup-updates {args.warmup_updates}: between 1 and --updates "
                         f"({args.updates})")
    if args.log_interval is not None and args.log_interval < 1:
        raise InputError(f"--log-interval {args.log_interval}: at least 1 update")
    if args.curve_interval:
        # the curve is scored from the checkpoints fairseq keeps at multiples of the interval,
        # and fairseq writes an interval checkpoint only every --save-interval-updates
        if not 0 < args.curve_interval <= args.updates:
            raise InputError(f"--curve-interval {args.curve_interval}: between 1 and --updates "
                             f"({args.updates}), or 0 for no learning curve")
        if (not args.save_interval_updates
                or args.curve_interval % args.save_interval_updates):
            raise InputError(f"--curve-interval {args.curve_interval} needs checkpoints at its "
                             f"multiples: a multiple of --save-interval-updates "
                             f"({args.save_interval_updates})")
    points = curve_points(args.updates, args.curve_interval) if args.curve_interval else []
    for update in args.test_at:
        if update not in points or update == args.updates:
            raise InputError(f"--test-at {update}: not a point of the learning curve before the "
                             f"end (--curve-interval {args.curve_interval}, --updates "
                             f"{args.updates})")
    if args.shorter_report:
        other = runs.read_json(args.shorter_report)
        if not other or "depths" not in other:
            raise InputError(f"--shorter-report {args.shorter_report}: not a report of this "
                             "script (results.json)")
        if other.get("updates", args.updates) >= args.updates:
            raise InputError(f"--shorter-report {args.shorter_report}: its runs trained "
                             f"{other.get('updates')} updates, not fewer than --updates "
                             f"{args.updates}")
        if other.get("embed_dim") != args.embed_dim:
            raise InputError(f"--shorter-report {args.shorter_report}: d={other.get('embed_dim')}"
                             f", not --embed-dim {args.embed_dim}")
    if args.shorter_runs and not os.path.isdir(args.shorter_runs):
        raise InputError(f"--shorter-runs {args.shorter_runs}: no such folder")
    data_dict = os.path.join(args.data, "dict.txt")
    for needed in (data_dict, *(os.path.join(args.data, f"{s}.bin") for s in ("train",
                                                                            "valid", "test"))):
        if not os.path.isfile(needed):
            raise InputError(f"{args.data}: no {os.path.basename(needed)}; prepare the data "
                             "first (python scripts/prepare/lm.py --dataset wikitext-2 ...)")
    with open(data_dict, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    # the kept runs too: a fresh clone's data must be prepared with their dictionary
    folders = [(args.out_dir, "--out-dir")] + ([(args.keep_runs, "--keep-runs")]
                                               if args.keep_runs else [])
    for folder, flag in folders:
        stamp = os.path.join(folder, "dictionary.sha256")
        if os.path.exists(stamp):
            with open(stamp) as f:
                started = f.read().strip()
            if started != digest:
                raise InputError(f"{args.data} was prepared with another dictionary than the "
                                 f"runs in {folder} (dict.txt sha256 {digest[:12]}, the runs' "
                                 f"{started[:12]}): use that data or another {flag}")
    # written once: an existing stamp holds this digest (checked above), and rewriting it
    # would change the kept folder's file times with nothing new in it (lm_depth_long.sh
    # writes a report between stages only when a kept file changed)
    for folder, _ in folders:
        os.makedirs(folder, exist_ok=True)
        stamp = os.path.join(folder, "dictionary.sha256")
        if not os.path.exists(stamp):
            with open(stamp, "w") as f:
                f.write(digest + "\n")


def score_blocks(checkpoint, data, subset, device="cpu"):
    """Per block of ``subset``: (NLL in bits, tokens), n_blocks x 2 (blocks of the context
    length, each scored from its first token, as fairseq-eval-lm's default), in fp32 on
    ``device``."""
    import torch

    from fairseq import checkpoint_utils

    import fairseq_plugins  # noqa: F401  its models and checkpoint allow-list (a run's process)

    models, _, task = checkpoint_utils.load_model_ensemble_and_task(
        [checkpoint], arg_overrides={"data": data})
    model = models[0].float().to(device).eval()
    task.load_dataset(subset)
    dataset = task.dataset(subset)
    pad = task.source_dictionary.pad()
    out = []
    with torch.no_grad():
        for start in range(0, len(dataset), 32):
            batch = dataset.collater([dataset[i] for i in range(start,
                                                                min(start + 32, len(dataset)))])
            logits = model(batch["net_input"]["src_tokens"].to(device))[0]
            lprobs = torch.log_softmax(logits.float(), dim=-1)
            target = batch["target"].to(device)
            nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
            mask = target.ne(pad)
            out += [[float((nll[b] * mask[b]).sum()) / math.log(2), int(mask[b].sum())]
                    for b in range(target.size(0))]
    return np.array(out)


def run_bits(blocks):
    """A run's bits per token on its scored ``blocks`` (``score_blocks``), as result.json keeps
    them (``RUN_BITS_DIGITS`` decimals)."""
    return round(significance.score("bits", blocks), RUN_BITS_DIGITS)


def finished_run(run_dir, kept_dir, recipe):
    """A finished run's result, or None; with ``--keep-runs`` the output and kept folders
    agree (``runs.synced_result``) over KEPT_FILES and the test-at points a run has."""
    return runs.synced_result(run_dir, kept_dir, recipe, kept_files)


def kept_files(folder):
    """KEPT_FILES and the test-at points ``folder`` holds (a later seed has no analysis)."""
    return [*KEPT_FILES, *sorted(n for n in os.listdir(folder) if TEST_AT.fullmatch(n))]


def test_at_points(args, run_dir, kept_dir, row, depth, seed, result):
    """A finished run's test blocks at the ``--test-at`` points it lacks (it finished before
    they were asked for, and its checkpoints are gone): the recipe trained again to the point
    (the same flags but --max-update, seed and threads; the schedule does not depend on
    --max-update, so it is the long run's first updates) into a scratch folder, kept only when
    its validation bits are the run's curve point there (to the curve's 5 decimals), else
    reported, left out and not tried again (``test_blocks_<N>.mismatch.json`` in the run's
    folder and the kept one). -> the run's result (unchanged: the blocks are files beside it)."""
    for update in missing_test_at(args, run_dir, result):
        name = f"test_blocks_{update}.npy"
        mismatch = os.path.join(run_dir, f"test_blocks_{update}.mismatch.json")
        print(f"  {row} at {depth} blocks, seed {seed}: training {update} updates again for "
              f"{name}", file=sys.stderr, flush=True)
        scratch = os.path.join(run_dir, f"at{update}")
        runs.fresh_run_dir(scratch)
        flags = args_recipe_flags(args)
        flags[flags.index("--max-update") + 1] = update
        arch, model = row_spec(row, depth, args.embed_dim)
        runs.run_logged(runs.train_command(args.data, scratch, seed, [
            "--arch", arch, *model, *flags, "--save-interval-updates", 0]),
            os.path.join(scratch, "train.log"))
        checkpoint = os.path.join(scratch, "checkpoint_last.pt")
        bits = run_bits(score_blocks(checkpoint, args.data, "valid"))
        expected = result["curve"]["valid_bits"][result["curve"]["updates"].index(update)]
        if bits == expected:
            written = os.path.join(run_dir, name)
            np.save(written, score_blocks(checkpoint, args.data, "test"))
        else:
            written = mismatch
            runs.write_json(mismatch, {"valid_bits": bits, "curve_valid_bits": expected,
                                       "code": runs.package_version(),
                                       "machine": runs.machine()})
            print(f"  not the same model: {bits} validation bits at update {update}, the run's "
                  f"curve has {expected} (other code, threads or machine?): {row} at {depth} "
                  f"blocks, seed {seed} stays out of the table at {update}", file=sys.stderr,
                  flush=True)
        if kept_dir:  # either is kept with the run: a fresh clone does not try again either
            shutil.copyfile(written, os.path.join(kept_dir, os.path.basename(written)))
        shutil.rmtree(scratch)
    return result


def missing_test_at(args, run_dir, result):
    """The ``--test-at`` points a finished run has neither test blocks for nor a recorded
    mismatch (a recovery that gave another model is not tried again at every restart); none for
    a diverged run or one without a curve."""
    if result.get("diverged") or not result.get("curve"):
        return []
    return [update for update in args.test_at
            if not any(os.path.exists(os.path.join(run_dir, f"test_blocks_{update}.{ext}"))
                       for ext in ("npy", "mismatch.json"))]


def kept_dir(args, run):
    """A run's folder under ``--keep-runs`` (None without it)."""
    depth, row, seed = run.key
    return (os.path.join(args.keep_runs, f"d{depth}", row, f"seed{seed}")
            if args.keep_runs else None)


def work(run, args, recipes):
    """The runner's work: one run (``run.setting`` is its depth) with its recipe -> its
    result (train_and_score)."""
    depth, row, seed = run.key
    return train_and_score(args, run.run_dir, kept_dir(args, run), row, depth, seed,
                           recipes[run.key])


def training_log(log):
    """What a run's fairseq log holds of its training -> ``(losses, gains, curve)``: the loss of
    every logged update in update order; the Amax gains of its composite stream mixing
    (``amax_gain_forward`` / ``amax_gain_backward``) at the last logged update ({}: the row
    logs none); and those gains at every logged update (``{"update": [...], key: [...]}``;
    None: none logged), so that a report can say how they moved on the way, not only where
    they ended. A resumed run's records are those of the attempt it finished with
    (``fairseq_log.final_attempt``)."""
    losses, curve = [], {"update": []}
    for update, record in fairseq_log.final_attempt(fairseq_log.records(log, "train_inner")):
        losses.append(float(record["loss"]))
        now = {key.split("connection_")[-1]: float(value)
               for key, value in record.items() if "amax_gain" in key}
        if now:
            curve["update"].append(update)
            for key, value in now.items():
                curve.setdefault(key, []).append(value)
    if not curve["update"]:
        return losses, {}, None
    # the gains at the end: the curve's last values
    return losses, {key: values[-1] for key, values in curve.items() if key != "update"}, curve


def amax_gain_peak(curve):
    """The highest logged Amax gain of a run and the update it was logged at, per direction
    (``{key: [gain, update]}``); None for a run without the curve (trained before it was
    recorded, or a row without the composite mixing)."""
    if not curve:
        return None
    peaks = {}
    for key, values in curve.items():
        if key != "update":
            i = max(range(len(values)), key=values.__getitem__)
            peaks[key] = [values[i], curve["update"][i]]
    return peaks


def train_and_score(args, run_dir, kept_dir, row, depth, seed, recipe):
    done = finished_run(run_dir, kept_dir, recipe)
    if done is not None:
        return test_at_points(args, run_dir, kept_dir, row, depth, seed, done)
    # an interrupted run with a checkpoint of the same recipe continues from it (fairseq seeds
    # every update with seed + update number and restores the data position: the same run as
    # an uninterrupted one, tested); anything else starts from scratch
    checkpoint = os.path.join(run_dir, "checkpoint_last.pt")
    started = os.path.join(run_dir, STARTED)
    resumed = os.path.exists(checkpoint) and runs.read_json(started) == recipe
    if not resumed:
        runs.fresh_run_dir(run_dir)
        runs.write_json(started, recipe)
        runs.write_json(os.path.join(run_dir, CPU_SECONDS), [])
    machines = runs.record_machine(run_dir, resumed)
    arch, flags = row_spec(row, depth, args.embed_dim)
    start = time.time()
    log = os.path.join(run_dir, "train.log")
    result = {"row": row, "depth": depth, "seed": seed, "recipe": recipe, "arch": arch,
              "flags": flags, "code": runs.package_version(), "threads": args.threads,
              "allocator": args.allocator, "resumed": resumed, "machines": machines}
    saves = (["--save-interval-updates", args.save_interval_updates,
              "--keep-interval-updates", 1] if args.save_interval_updates else [])
    if args.curve_interval:  # fairseq keeps every interval checkpoint at a curve point
        saves += ["--keep-interval-updates-pattern", args.curve_interval]
    cpu_file = os.path.join(run_dir, CPU_SECONDS)
    segments = runs.read_json(cpu_file)

    def record_cpu(seconds):
        # this process's count so far in its own place (a null there: a process of a run begun
        # before the count was kept while it trained); a process killed with this script (a
        # session's end) loses at most the last interval of its count, not all of it
        runs.write_json(cpu_file, segments + [round(seconds, 1)])
    if segments is not None:
        record_cpu(0.0)
    try:
        cpu = runs.run_logged(runs.train_command(args.data, run_dir, seed, [
            "--arch", arch, *flags, *args_recipe_flags(args), *saves]), log, append=resumed,
            on_cpu=record_cpu if segments is not None else None)
    except runs.StepError as e:
        # a loss that became NaN / inf is a result of the row (reported as diverged), any
        # other failure a bug to see
        if not runs.diverged(e):
            raise
        result.update(diverged=True, error=str(e)[-500:], valid_bits=None, test_bits=None,
                      valid_ppl=None, test_ppl=None, params=None)
        runs.save_result(run_dir, result)
        return finished_run(run_dir, kept_dir, recipe)
    losses, gains, gain_curve = training_log(log)
    # CPU time, unlike the wall clock, counts neither a pause (SIGSTOP while CI runs) nor the
    # other runs sharing the machine, and adds up over the processes of a resumed run
    if segments is not None:
        segments.append(round(cpu, 1))
    complete = segments is not None and None not in segments
    result.update(params=runs.count_params(checkpoint),
                  train_seconds=round(time.time() - start, 1), train_losses=losses,
                  train_cpu_seconds=round(sum(segments), 1) if complete else None,
                  amax_gain=gains or None, amax_gain_curve=gain_curve)
    if seed == args.seeds[0]:
        runs.run_logged([sys.executable, paths.script("analyze_layers.py"), checkpoint,
                         "--data", args.data, "--subset", "valid", "--max-sentences", 256,
                         "--batch-size", 16, "--out-dir", os.path.join(run_dir, "analysis")],
                        os.path.join(run_dir, "analysis.log"))
    for subset in ("valid", "test"):
        blocks = score_blocks(checkpoint, args.data, subset)
        np.save(os.path.join(run_dir, f"{subset}_blocks.npy"), blocks)
        result[f"{subset}_bits"] = run_bits(blocks)
        result[f"{subset}_ppl"] = round(2 ** result[f"{subset}_bits"], 3)
    result["diverged"] = not all(np.isfinite([result["valid_bits"], result["test_bits"]]))
    if args.curve_interval:
        result["curve"] = learning_curve(run_dir, args, result["valid_bits"])
        kept = interval_checkpoints(run_dir)
        for update in args.test_at:  # a curve point: its checkpoint is there (checked above)
            np.save(os.path.join(run_dir, f"test_blocks_{update}.npy"),
                    score_blocks(kept[update], args.data, "test"))
    for name in os.listdir(run_dir):  # the checkpoints are not kept (tens of MB per run)
        if name.endswith(".pt") or name == STARTED:
            os.remove(os.path.join(run_dir, name))
    runs.save_result(run_dir, result)
    return finished_run(run_dir, kept_dir, recipe)


def curve_points(updates, interval):
    """The updates at which a run's learning curve is scored: every ``interval``-th, and the
    last."""
    return sorted({*range(interval, updates + 1, interval), updates})


def interval_checkpoints(run_dir):
    """{update: path} of the interval checkpoints fairseq kept in a run's folder
    (``checkpoint_<epoch>_<updates>.pt``)."""
    kept = {}
    for name in os.listdir(run_dir):
        parts = name[:-len(".pt")].split("_") if name.endswith(".pt") else []
        if len(parts) == 3 and parts[0] == "checkpoint" and parts[2].isdigit():
            kept[int(parts[2])] = os.path.join(run_dir, name)
    return kept


def learning_curve(run_dir, args, final_valid_bits):
    """{"updates": [...], "valid_bits": [...]}: the full validation set scored (as the final
    ``valid_bits``, by ``score_blocks``) with the checkpoint fairseq kept at every curve point
    (``checkpoint_<epoch>_<updates>.pt``; the last point is the final model, already scored)."""
    kept = interval_checkpoints(run_dir)
    points = curve_points(args.updates, args.curve_interval)
    bits = []
    for update in points:
        if update == args.updates:
            bits.append(final_valid_bits)
            continue
        if update not in kept:  # e.g. the update ended an epoch (no interval checkpoint then)
            raise runs.StepError(f"{run_dir}: no checkpoint at update {update} for the learning "
                                 "curve")
        blocks = score_blocks(kept[update], args.data, "valid")
        bits.append(run_bits(blocks))
    return {"updates": points, "valid_bits": bits}


def bench_ratios(plan=None):
    """{depth: {bench row: {measure: its ratio to the plain LM}}}, each measure (the keys of
    BENCH_FILES) read from its own committed bench runs; a file not in this checkout leaves its
    depth's measure out (the report prints "—"). With ``plan`` ((depth, row) pairs): also
    {measure: the files the report's caption names, in BENCH_FILES' order}: the suite's at
    BENCH_DEPTHS, and a file of rows added later (LAuReL's) where it measured a row of the plan
    at its depth."""
    out, used = {}, {measure: [n for n in names if n in SUITE_BENCH_FILES]
                     for measure, names in BENCH_FILES.items()}
    # the plain model's ratio is 1 by definition: every file measures it, none is needed for it
    wanted = {(str(depth), BENCH_ROWS.get(row)) for depth, row in plan or ()
              if BENCH_ROWS.get(row) != BENCH_ROWS[BASELINE]}
    for measure, names in BENCH_FILES.items():
        for name in names:
            path = os.path.join(paths.RESULTS, name)
            if not os.path.exists(path):
                continue
            with open(path) as f:
                for depth, rows in json.load(f).get("depths", {}).items():
                    for row, measured in rows.items():
                        out.setdefault(depth, {}).setdefault(row, {})[measure] = \
                            measured.get(measure)
                        if (depth, row) in wanted and name not in used[measure]:
                            used[measure].append(name)
    return (out, used) if plan is not None else out


def paired_test(rows_blocks, base_blocks, paired_seeds=False):
    """The hierarchical bootstrap of one row against a baseline (each a list of per-seed test
    blocks); with one seed on either side the interval holds the test blocks' sampling only,
    not the seed spread (the issue's ~0.03 bits), and with two it sees half its variance: no verdict
    below ``VERDICT_SEEDS`` on either side (``seeds``: the fewer of the two). ``paired_seeds``:
    the two lists hold the same seeds in the same order, and the bootstrap draws them together
    (``significance.paired_hierarchical_bootstrap``: the per-seed differences resampled)."""
    test = (significance.paired_hierarchical_bootstrap if paired_seeds
            else significance.hierarchical_bootstrap)("bits", rows_blocks, base_blocks)
    test["seeds"] = min(len(rows_blocks), len(base_blocks))
    if test["seeds"] < VERDICT_SEEDS:
        test["larger_than_noise"] = None
    # "x% lower perplexity": the perplexity is 2^bits, so its ratio is 2^difference
    test["ppl_ratio"] = {k: round(2 ** test[k], 5) for k in ("difference", "low", "high")}
    return test


def paired_cells(test):
    """The cells of the test paired over seeds: the difference [95%], the verdict."""
    if test is None:
        return "— | —"
    return (f"{test['difference']:+.4f} [{test['low']:+.4f}, {test['high']:+.4f}] | "
            f"{verdict(test)}")


def test_cells(diff, all_diverged):
    """The markdown cells of a row's test against the baseline: the difference [95%], the
    perplexity change, the verdict, the difference seed by seed (``diff``: its paired_test
    with ``by_seed``; None: not tested)."""
    if diff is None:
        return " | ".join(["diverged" if all_diverged else "—"] + ["—"] * 3)
    by_seed = " / ".join(f"{d:+.3f}" for d in diff["by_seed"].values()) or "—"
    return (f"{diff['difference']:+.4f} [{diff['low']:+.4f}, {diff['high']:+.4f}] | "
            f"{100 * (diff['ppl_ratio']['difference'] - 1):+.1f}% | "
            f"{verdict(diff)} | {by_seed}")


def verdict(test):
    """A paired_test's verdict as the tables write it."""
    if test["larger_than_noise"] is None:
        n = test["seeds"]
        return f"not judged ({n} seed{'s' if n > 1 else ''})"
    return "yes" if test["larger_than_noise"] else "no"


def summarise(args, results, plan, matched_of=None):
    """The report (JSON) and its markdown of the finished runs; ``matched_of`` {(depth, row):
    its matched-parameter baseline}."""
    matched_of = matched_of or {}
    # the caption names the bench files of the rows this report has runs of
    bench, bench_files = bench_ratios([(depth, row) for depth, row in plan if any(
        (depth, row, seed) in results for seed in args.seeds)])
    codes = sorted({r.get("code", "not recorded") for r in results.values()})
    written = (f"Written {time.strftime('%Y-%m-%d')} by `{args.command}` with "
               f"{runs.package_version()}; the runs' code: {', '.join(codes)}.")
    report = {"data": args.data, "updates": args.updates, "embed_dim": args.embed_dim,
              "seeds": args.seeds, "written": written, "depths": {}}
    lines = [written, "",
             f"gpt_baseline_lm (and ar_encdec_lm) rows at d={args.embed_dim}, context {CONTEXT}, "
             f"batch {BATCH}, "
             f"{args.updates} updates, seeds {','.join(map(str, args.seeds))}; bits per token "
             "on the test blocks (mean ± sample std over the row's converged seeds); Δ vs the "
             "baseline with the 95% interval of the hierarchical bootstrap over test blocks and "
             f"seeds (with fewer than {VERDICT_SEEDS} seeds on either side it covers too little of "
             "the seed spread, and no verdict is given), and as the change of the perplexity "
             "(2^Δ - 1); Δ by seed: the row's test bits minus the baseline's trained with the "
             "same seed (the same data order), in the order of the seeds column; time and "
             "memory: scripts/bench/depth.py at the same depth and the runs' vocabulary and "
             "dropout, the time "
             "as the runs train (one thread, two processes at a time, their allocator settings: "
             f"{', '.join('results/' + n for n in bench_files['train_time_ratio'])}), the peak "
             "memory under glibc's defaults ("
             f"{', '.join('results/' + n for n in bench_files['memory_growth_ratio'])}); "
             "—: not benchmarked.",
             ""]

    def finished(depth, row):  # the seeds of a row that have a result (all, unless partial)
        return [s for s in args.seeds if (depth, row, s) in results]

    def converged(depth, row):  # a diverged seed has no scores to average or to test
        return [s for s in finished(depth, row) if not results[(depth, row, s)]["diverged"]]

    loaded = {}

    def seed_blocks(depth, row, seed):  # loaded once: a baseline is read for every row
        if (depth, row, seed) not in loaded:
            loaded[(depth, row, seed)] = np.load(os.path.join(
                args.out_dir, f"d{depth}", row, f"seed{seed}", "test_blocks.npy"))
        return loaded[(depth, row, seed)]

    def blocks(depth, row):
        return [seed_blocks(depth, row, s) for s in converged(depth, row)]

    def depth_curve(depth, row):
        """The row's learning curve as differences from the baseline trained with the same
        seed: {updates, seeds, delta_mean, delta_low, delta_high} (low / high: the seeds'
        range), or None when no seed of both has a curve."""
        base = {s: results[(depth, BASELINE, s)].get("curve") for s in converged(depth, BASELINE)}
        own = {s: results[(depth, row, s)].get("curve") for s in converged(depth, row)}
        seeds = [s for s in own if own[s] and base.get(s)
                 and own[s]["updates"] == base[s]["updates"]]
        if not seeds:
            return None
        deltas = np.array([np.subtract(own[s]["valid_bits"], base[s]["valid_bits"])
                           for s in seeds])
        return {"updates": own[seeds[0]]["updates"], "seeds": seeds,
                **{f"delta_{k}": [round(float(x), CURVE_DIGITS)
                                   for x in f(deltas, axis=0)]
                   for k, f in (("mean", np.mean), ("low", np.min), ("high", np.max))}}

    def baseline_curves(depth):  # the baseline's learning curves (its converged seeds')
        return [results[(depth, BASELINE, s)]["curve"] for s in converged(depth, BASELINE)
                if results[(depth, BASELINE, s)].get("curve")]

    def paired(depth, row):  # the test paired over the seeds both rows converged at
        shared = [s for s in converged(depth, row) if s in converged(depth, BASELINE)]
        return paired_test([seed_blocks(depth, row, s) for s in shared],
                           [seed_blocks(depth, BASELINE, s) for s in shared],
                           paired_seeds=True) if shared else None

    for depth in args.depths:
        rows = [r for (d, r) in plan if d == depth and finished(d, r)]
        if not rows:
            continue
        base = blocks(depth, BASELINE)
        table = {}
        lines += [f"### {depth} blocks", "",
                  "| row | seeds | params | valid bits | valid ppl | test bits | test ppl | "
                  "Δ test bits [95%] | test ppl vs baseline | beyond noise | Δ by seed | "
                  "paired over seeds [95%] | beyond noise (paired) | time | memory |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|:-:|---:|---:|:-:|---:|---:|"]
        for row in rows:
            seeds = finished(depth, row)
            done = [results[(depth, row, s)] for s in seeds]
            # scores over the seeds that converged; the diverged ones are named beside them (a
            # result of the row, not a missing run)
            ok = [results[(depth, row, s)] for s in converged(depth, row)]
            valid = stats.mean_std([r["valid_bits"] for r in ok])
            test = stats.mean_std([r["test_bits"] for r in ok])
            entry = {"params": next((r["params"] for r in done if r["params"]), None),
                     "amax_gain": [r.get("amax_gain") for r in done],
                     "amax_gain_peak": [amax_gain_peak(r.get("amax_gain_curve")) for r in done],
                     "valid_bits": valid, "test_bits": test,
                     "valid_ppl": stats.mean_std([r["valid_ppl"] for r in ok]),
                     "test_ppl": stats.mean_std([r["test_ppl"] for r in ok]),
                     "seeds": seeds,
                     "diverged": [r["seed"] for r in done if r["diverged"]]}
            if row != BASELINE and ok and base:
                entry["vs_baseline"] = paired_test(blocks(depth, row), base)
                # beside the test: the difference at each seed the two rows share (the same seed
                # is the same data order): whether the sign holds seed by seed. Five decimals,
                # those of the runs' test bits: exact, so the table's three are rounded once
                shared = set(converged(depth, BASELINE))
                entry["vs_baseline"]["by_seed"] = {
                    str(s): round(results[(depth, row, s)]["test_bits"]
                                  - results[(depth, BASELINE, s)]["test_bits"], RUN_BITS_DIGITS)
                    for s in converged(depth, row) if s in shared}
                entry["vs_baseline_paired"] = paired(depth, row)
            matched = matched_of.get((depth, row))
            if matched and ok and converged(depth, matched):
                entry["vs_matched"] = dict(paired_test(blocks(depth, row),
                                                       blocks(depth, matched)), baseline=matched)
            measured = bench.get(str(depth), {}).get(BENCH_ROWS.get(row, ""), {})
            entry["train_time_ratio"] = measured.get("train_time_ratio")
            entry["memory_growth_ratio"] = measured.get("memory_growth_ratio")
            table[row] = entry
            diff = entry.get("vs_baseline")
            lines.append(
                f"| {row} | {','.join(map(str, seeds))}"
                + (f" ({','.join(map(str, entry['diverged']))} diverged)" if entry["diverged"]
                   else "") + f" | {entry['params'] or 0:,} | "
                f"{stats.fmt(*valid, digits=4)} | {stats.fmt(*entry['valid_ppl'], digits=1)} | "
                f"{stats.fmt(*test, digits=4)} | "
                f"{stats.fmt(*entry['test_ppl'], digits=1)} | "
                + test_cells(diff, all_diverged=bool(entry["diverged"]) and not ok)
                + " | " + paired_cells(entry.get("vs_baseline_paired"))
                + "".join(f" | {value:.3f}" if value is not None else " | —"
                          for value in (entry["train_time_ratio"], entry["memory_growth_ratio"]))
                + " |")
        against = {row: e for row, e in table.items() if "vs_matched" in e}
        if against:
            lines += ["", "Rows with more than 2% extra parameters against the baseline with as "
                      "many (a wider FFN), the same test:", "",
                      "| row | params | matched baseline | its params | Δ test bits [95%] | "
                      "beyond noise |", "|---|---:|---|---:|---:|:-:|"]
            for row, e in against.items():
                m = e["vs_matched"]
                lines.append(f"| {row} | {e['params'] or 0:,} | {m['baseline']} | "
                             f"{table[m['baseline']]['params'] or 0:,} | "
                             f"{m['difference']:+.4f} [{m['low']:+.4f}, {m['high']:+.4f}] | "
                             f"{verdict(m)} |")
        gains = [row for row, e in table.items() if any(e["amax_gain"])]
        if gains:
            lines += ["", "Amax gain of the composite stream mixing (forward / backward, per "
                      "seed) at the end of training (the last logged interval) and the highest "
                      "logged on the way, with the update it was logged at (—: a run trained "
                      "before the gains of every logged update were recorded):", "",
                      "| row | at the end | highest (update) |", "|---|---|---|"]
            directions = ("amax_gain_forward", "amax_gain_backward")
            for row in gains:
                end_cells, peak_cells = [], []
                for end, peak in zip(table[row]["amax_gain"], table[row]["amax_gain_peak"]):
                    if not end:
                        continue
                    end_cells.append(" / ".join(f"{end.get(key, float('nan')):.3f}"
                                                for key in directions))
                    peak_cells.append("—" if peak is None else " / ".join(
                        f"{peak[key][0]:.3f} ({peak[key][1]:,})" if key in peak else "—"
                        for key in directions))
                lines.append(f"| {row} | {'; '.join(end_cells)} | {'; '.join(peak_cells)} |")
        lines.append("")
        report["depths"][str(depth)] = table
        curves = {row: depth_curve(depth, row) for row in rows if row != BASELINE}
        curves = {row: c for row, c in curves.items() if c}
        if curves:
            report.setdefault("curves", {})[str(depth)] = curves
            lines += curve_lines(depth, curves, baseline_curves(depth))
    if len(report["depths"]) > 1:
        report["ranking"], ranking_lines = ranking_across_depths(report["depths"])
        lines += ranking_lines
    base_curves = {depth: baseline_curves(depth) for depth in args.depths}
    if sum(bool(c) for c in base_curves.values()) > 1:
        report["baseline_curves"], depth_lines = baseline_across_depths(base_curves)
        lines += depth_lines
    report["cpu_time"], cpu_lines = cpu_time(results, args.updates)
    lines += cpu_lines
    return report, "\n".join(lines)


def cpu_time(results, updates):
    """The CPU time the finished runs' training took (fairseq-train's processes, summed over a
    resumed run's): measured where a run's count is complete, estimated for a run whose count
    is not (a process of it ran before the count was kept, a null in its segments) as
    ``updates`` times the CPU seconds per update of the same row's complete runs at the same
    depth; a run without such a twin is counted as not estimated, and runs that all trained
    before the count was kept (none has the field) are said to be so in one line. ``results``
    {(depth, row, seed): result}. -> (JSON entry, markdown lines)."""
    complete = [r for r in results.values() if r.get("train_cpu_seconds") is not None]
    per_update = {}
    for r in complete:
        per_update.setdefault((r["depth"], r["row"]), []).append(r["train_cpu_seconds"] / updates)
    estimated, missing = [], []
    for (depth, row, seed), r in sorted(results.items()):
        if r.get("train_cpu_seconds") is None:
            rates = per_update.get((depth, row))
            if rates:
                estimated.append(float(np.mean(rates)) * updates)
            else:
                missing.append(f"{row} at {depth} blocks, seed {seed}")
    measured = sum(r["train_cpu_seconds"] for r in complete)
    hours = (measured + sum(estimated)) / 3600
    entry = {"measured_core_hours": round(measured / 3600, 2), "measured_runs": len(complete),
             "estimated_core_hours": round(sum(estimated) / 3600, 2),
             "estimated_runs": len(estimated), "not_estimated": missing}
    entry["machines"], machine_text = runs.machines_used(results.values())
    if results and all("train_cpu_seconds" not in r for r in results.values()):
        # every run older than the count (the 800-update comparison's): one line, not each run
        return entry, ["### CPU time", "", f"Not recorded: the {len(results)} runs trained "
                       "before their CPU time was counted.", "", machine_text, ""]
    if not complete:
        text = "No run's CPU time is complete yet"
    else:
        text = (f"Training took {hours:.1f} core-hours for {len(results) - len(missing)} "
                f"runs: {measured / 3600:.1f} measured over {len(complete)} runs")
    if estimated:
        text += (f", {sum(estimated) / 3600:.1f} estimated for {len(estimated)} whose count is "
                 "incomplete (a process of theirs ran before the count was kept), at the CPU "
                 "seconds per update of the same row's complete runs at the same depth")
    text += "."
    if missing:
        text += (f" Not estimated (no complete run of the same row and depth yet): "
                 f"{'; '.join(missing)}.")
    return entry, ["### CPU time", "", text + " The scoring and the curves are not counted "
                   "(about 5% more).", "", machine_text, ""]


def baseline_across_depths(curves):
    """The baseline's validation bits at every recorded update and depth (mean over its seeds),
    and from which update each deeper baseline stays below the shallowest one's (the depth
    search of a longer comparison). ``curves``: {depth: [curve of each seed]}. -> (JSON entry,
    markdown lines)."""
    curves = {d: c for d, c in sorted(curves.items()) if c}
    updates = next(iter(curves.values()))[0]["updates"]
    means = {d: mean_curve(cs) for d, cs in curves.items()
             if all(c["updates"] == updates for c in cs)}
    shallow = min(means)
    below = {}
    for d, bits in means.items():
        if d == shallow:
            continue
        ahead = [b < s for b, s in zip(bits, means[shallow])]
        # the first update from which the deeper baseline stays below the shallow one
        below[d] = next((updates[i] for i in range(len(updates)) if all(ahead[i:])), None)
    lines = ["### The baseline at each depth", "",
             "Validation bits (the full set; mean over the baseline's seeds) at every recorded "
             f"update; the last column: from which update the baseline stays below the "
             f"{shallow}-block one (—: not by the end).", "",
             "| blocks | seeds | " + " | ".join(map(str, updates)) + " | below from |",
             "|---:|---:|" + "---:|" * (len(updates) + 1)]
    for d, bits in means.items():
        lines.append(f"| {d} | {len(curves[d])} | " + " | ".join(f"{b:.4f}" for b in bits)
                     + f" | {'—' if d == shallow or below[d] is None else below[d]} |")
    entry = {"updates": updates, "valid_bits": {str(d): [round(b, CURVE_DIGITS)
                                                      for b in bits]
                                                for d, bits in means.items()},
             "below_shallowest_from": {str(d): u for d, u in below.items()}}
    return entry, lines + [""]


def mean_curve(curves):
    """The validation bits of several seeds' curves (the same updates), averaged point by
    point."""
    return [float(np.mean(bits)) for bits in zip(*(c["valid_bits"] for c in curves))]


def curve_lines(depth, curves, base_curves):
    """The markdown of one depth's learning curves: the baseline's validation bits (``base_curves``:
    its seeds' curves) and every row's mean difference from it at each recorded update, with the
    row's rank there (1: the lowest validation bits), and the rank correlation of the first and
    the last point."""
    updates = next(iter(curves.values()))["updates"]
    curves = {row: c for row, c in curves.items() if c["updates"] == updates}
    base = [c for c in base_curves if c["updates"] == updates]
    ranks = np.argsort(np.argsort([c["delta_mean"] for c in curves.values()], axis=0), axis=0) + 1
    lines = [f"Learning curves at {depth} blocks: validation bits (the full set) of the baseline "
             "(mean over its seeds) and each row's difference from the baseline trained with "
             "the same seed (mean over seeds; in brackets the rank among the rows at that "
             "update, 1: the lowest):", "",
             "| row | seeds | " + " | ".join(f"{u}" for u in updates) + " |",
             "|---|---|" + "---:|" * len(updates),
             f"| baseline (bits) | {len(base)} | "
             + " | ".join(f"{b:.4f}" for b in mean_curve(base)) + " |"]
    for k, (row, c) in enumerate(curves.items()):
        lines.append(f"| {row} | {','.join(map(str, c['seeds']))} | " + " | ".join(
            f"{d:+.4f} ({r})" for d, r in zip(c["delta_mean"], ranks[k])) + " |")
    if len(curves) >= 3 and len(updates) > 1:
        rho = float(np.corrcoef(ranks[:, 0], ranks[:, -1])[0, 1])
        lines += ["", f"Spearman's rank correlation of the rows' ranks at {updates[0]} and "
                  f"{updates[-1]} updates: {rho:+.2f} over {len(curves)} rows."]
    return lines + [""]


def ranking_across_depths(depths):
    """Whether the rows rank alike at every depth: the rows measured against the baseline at
    the shallowest and the deepest depth that has any (a depth with the baseline alone, e.g.
    the 12 blocks of the longer comparison's depth search, ranks nothing), ranked by their
    difference at each (1: the largest gain), and Spearman's rank correlation of the two
    rankings (no ties expected: differences of real runs). Each difference is shown with the
    seeds its test had (the fewer side's): a row with one seed at a depth ranks on that seed
    alone. -> (JSON entry, markdown lines)."""
    measured = [d for d in sorted(depths, key=int)
                if any("vs_baseline" in e for e in depths[d].values())]
    if len(measured) < 2:
        return {"depths": [int(d) for d in measured], "rows": [], "spearman": None}, []
    low, high = measured[0], measured[-1]
    rows = [r for r in depths[low] if "vs_baseline" in depths[low][r]
            and "vs_baseline" in depths[high].get(r, {})]
    if len(rows) < 3:
        return {"depths": [int(low), int(high)], "rows": rows, "spearman": None}, []
    diffs = {d: np.array([depths[d][r]["vs_baseline"]["difference"] for r in rows])
             for d in (low, high)}
    ranks = {d: np.argsort(np.argsort(diffs[d])) + 1 for d in (low, high)}
    spearman = float(np.corrcoef(ranks[low], ranks[high])[0, 1])
    entry = {"depths": [int(low), int(high)], "rows": rows, "spearman": round(spearman, 3),
             "ranks": {d: dict(zip(rows, map(int, ranks[d]))) for d in (low, high)}}
    lines = [f"### The ranking at {low} and {high} blocks", "",
             f"Rows ranked by their difference from the baseline (1: the largest gain); "
             f"Spearman's rank correlation between the depths: {spearman:+.2f} over "
             f"{len(rows)} rows.", "",
             f"| row | Δ at {low} | seeds | rank | Δ at {high} | seeds | rank |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    seeds = {d: [depths[d][r]["vs_baseline"]["seeds"] for r in rows] for d in (low, high)}
    for i in np.argsort(ranks[high]):
        lines.append(f"| {rows[i]} | {diffs[low][i]:+.4f} | {seeds[low][i]} | {ranks[low][i]} | "
                     f"{diffs[high][i]:+.4f} | {seeds[high][i]} | {ranks[high][i]} |")
    return entry, lines + [""]


def change_between_budgets(short, long):
    """How a row's difference from the baseline moved from a shorter to a longer training
    (each its ``vs_baseline`` test): 'lower' / 'higher' when the two 95% intervals are apart,
    'same within noise' when they overlap, 'not judged' below three seeds on either side; and
    what that means for the row: its gain (or deficit) grows, shrinks, persists or reverses.
    Overlapping intervals with only one budget's beyond noise say which (a difference that
    shows at one budget alone is neither a persisting one nor none at either)."""
    if short["larger_than_noise"] is None or long["larger_than_noise"] is None:
        return "not judged"
    gain = short["difference"] < 0
    what = "gain" if gain else "deficit"
    if long["high"] < short["low"]:
        moved = "lower"
    elif long["low"] > short["high"]:
        moved = "higher"
    else:
        beyond = (short["larger_than_noise"], long["larger_than_noise"])
        if beyond == (True, True):  # both beyond noise and overlapping: the same side of 0
            return f"same within noise: the {what} persists"
        return "same within noise: " + {
            (False, False): "no difference at either",
            (True, False): "beyond noise at the shorter budget only",
            (False, True): "beyond noise at the longer budget only"}[beyond]
    flipped = long["larger_than_noise"] and (long["difference"] < 0) != gain
    if flipped:
        return f"{moved}: the {what} reverses"
    return f"{moved}: the {what} {'grows' if (moved == 'lower') == gain else 'shrinks'}"


def budget_lines(args, report):
    """The comparison with a shorter budget's report (``--shorter-report``): per depth in both,
    every row's difference from the baseline at each budget, how it moved, and the rank
    correlation of the two budgets' rankings. -> (JSON entry, markdown lines)."""
    with open(args.shorter_report) as f:
        short = json.load(f)
    entry, lines = {"updates": [short["updates"], args.updates], "depths": {}}, []
    for depth, table in report["depths"].items():
        other = short["depths"].get(depth, {})
        tests = {r: (other[r]["vs_baseline"], table[r]["vs_baseline"]) for r in table
                 if "vs_baseline" in table[r] and "vs_baseline" in other.get(r, {})}
        if tests:
            entry["depths"][depth], more = moves_table(
                f"### {short['updates']} against {args.updates} updates, {depth} blocks",
                f"Δ test bits against the baseline after each budget (the {short['updates']}-"
                f"update runs: {args.shorter_report}), 95% intervals of the hierarchical "
                "bootstrap; moved: lower / higher when the two intervals are apart.",
                short["updates"], args.updates, tests)
            lines += more
    return entry, lines


def within_run_lines(args, report):
    """``--test-at``: per point and depth, every row's difference from the baseline on the test
    set at that point of the same runs (their ``test_blocks_<N>.npy``) beside the one at the
    end, how it moved, and the rank correlation of the two rankings. Both budgets are tested on
    the same seeds: the converged ones that have the point's scores (finished runs whose point
    could not be recovered lack them): a row with fewer than its table's seeds is named with
    them, a row with none is listed under the table (``missing``), never silently absent.
    -> (JSON entry, markdown lines)."""
    entry, lines = {}, []
    for update in args.test_at:
        for depth, table in report["depths"].items():
            base = point_seeds(args, depth, BASELINE, table.get(BASELINE), update)
            if not base:
                continue
            tests, missing, by_seed = {}, [], {}
            for row, e in table.items():
                if "vs_baseline" not in e:
                    continue
                own = point_seeds(args, depth, row, e, update)
                if not own:
                    missing.append(row)
                    continue
                label = row if len(own) == len(converged_seeds(e)) else (
                    f"{row} (seeds {','.join(map(str, own))})")
                point, end = (blocks_of(args, depth, row, own, base, at) for at in (update, None))
                tests[label] = (paired_test(*point), paired_test(*end))
                # beside the test: each seed the row shares with the baseline (the same data
                # order) at both budgets, so a move stays readable while the rows' seeds differ
                at_point, at_end = (seed_differences(own, base, *b) for b in (point, end))
                by_seed[label] = {s: (at_point[s], at_end[s]) for s in at_point}
            if not tests and not missing:
                continue
            title = f"### {update} against {args.updates} updates within the runs, {depth} blocks"
            if tests:
                table_entry, more = moves_table(
                    title, f"Δ test bits against the baseline with each run's checkpoint at "
                    f"update {update} (`--test-at`) and at the end: the same runs and seeds at "
                    f"both budgets (the baseline's: {','.join(map(str, base))}); 95% intervals "
                    "of the hierarchical bootstrap; moved: lower / higher when the two intervals "
                    "are apart; by seed: the row's test bits minus the baseline's of the same "
                    f"seed, at update {update} → at the end.", update, args.updates, tests,
                    by_seed)
            else:
                table_entry, more = {}, [title, ""]
            if missing:
                table_entry["missing"] = missing
                more += [f"Not here, no run of theirs having test scores at update {update} "
                         "(runs that finished before `--test-at` and whose recovery did not give "
                         f"the curve point's model: `test_blocks_{update}.mismatch.json` in the "
                         f"run's folder): {', '.join(missing)}.", ""]
            entry.setdefault(str(update), {})[depth] = table_entry
            lines += more
    return entry, lines


def converged_seeds(entry):
    return [s for s in entry["seeds"] if s not in entry["diverged"]]


def point_seeds(args, depth, row, entry, update):
    """The converged seeds of a row (``entry``: its report entry, None when not in the report)
    that have test blocks at ``update``."""
    if entry is None:
        return []
    return [s for s in converged_seeds(entry) if os.path.exists(os.path.join(
        args.out_dir, f"d{depth}", row, f"seed{s}", f"test_blocks_{update}.npy"))]


def blocks_of(args, depth, row, seeds, base_seeds, update):
    """(the row's per-seed test blocks, the baseline's) at ``update`` (None: at the end)."""
    name = f"test_blocks_{update}.npy" if update is not None else "test_blocks.npy"
    return tuple([np.load(os.path.join(args.out_dir, f"d{depth}", r, f"seed{s}", name))
                  for s in seeds] for r, seeds in ((row, seeds), (BASELINE, base_seeds)))


def seed_differences(seeds, base_seeds, row_blocks, base_blocks):
    """{seed: the row's test bits minus the baseline's of the same seed} over the seeds both
    have (``row_blocks`` / ``base_blocks``: per-seed test blocks in the order of ``seeds`` /
    ``base_seeds``, as ``blocks_of`` gives them), scored as ``significance.score`` sums them;
    unrounded, so that the table's three decimals are not rounded twice."""
    base = dict(zip(base_seeds, base_blocks))
    return {str(s): float(significance.score("bits", b) - significance.score("bits", base[s]))
            for s, b in zip(seeds, row_blocks) if s in base}


def moves_table(title, caption, short_updates, long_updates, tests, by_seed=None):
    """A row's difference from the baseline at two budgets, ``tests`` {row: (shorter budget's
    ``vs_baseline`` test, longer budget's)}: the markdown table with how each moved, and
    Spearman's rank correlation of the two rankings (three rows or more). ``by_seed`` {row:
    {seed: (difference at the shorter budget, at the longer)}}: a column and a JSON entry
    beside the tests (None: neither). -> ({moved, spearman[, by_seed]}, markdown lines)."""
    seed_column = by_seed is not None
    lines = [title, "", caption, "",
             f"| row | Δ at {short_updates} [95%] | Δ at {long_updates} [95%] | moved |"
             + (" by seed |" if seed_column else ""),
             "|---|---:|---:|---|" + ("---:|" if seed_column else "")]
    moves = {}
    for row, (a, b) in tests.items():
        moves[row] = change_between_budgets(a, b)
        seeds = ""
        if seed_column:
            seeds = " " + (" / ".join(f"{s}: {x:+.3f} → {y:+.3f}"
                                      for s, (x, y) in by_seed.get(row, {}).items()) or "—") + " |"
        lines.append(f"| {row} | {a['difference']:+.4f} [{a['low']:+.4f}, {a['high']:+.4f}] "
                     f"| {b['difference']:+.4f} [{b['low']:+.4f}, {b['high']:+.4f}] | "
                     f"{moves[row]} |{seeds}")
    spearman = None
    if len(tests) >= 3:
        ranks = [np.argsort(np.argsort([t[k]["difference"] for t in tests.values()]))
                 for k in (0, 1)]
        spearman = round(float(np.corrcoef(*ranks)[0, 1]), 3)
        lines += ["", f"Spearman's rank correlation of the two budgets' rankings: "
                  f"{spearman:+.2f} over {len(tests)} rows."]
    entry = {"moved": moves, "spearman": spearman}
    if seed_column:
        # two decimals more than the column's three, so that reading them to three rounds once
        entry["by_seed"] = {row: {s: [round(x, RUN_BITS_DIGITS) for x in pair]
                                  for s, pair in by_seed.get(row, {}).items()} for row in tests}
    return entry, lines + [""]


def reproduction_lines(args, results):
    """Whether each run's first updates are the shorter budget's run (``--shorter-runs``: its
    kept runs): the curve point at the shorter run's last update against that run's
    validation bits, and its logged training losses against the longer run's first ones (the
    same --log-interval). -> (JSON entry, markdown lines)."""
    checks = []
    for (depth, row, seed), long in sorted(results.items()):
        short = runs.read_json(os.path.join(args.shorter_runs, f"d{depth}", row, f"seed{seed}",
                                            "result.json"))
        curve = long.get("curve")
        if not short or not curve or short.get("diverged") or long.get("diverged"):
            continue
        budget = short["recipe"]["updates"]
        if budget not in curve["updates"]:
            continue
        losses = short.get("train_losses") or []
        checks.append({
            "depth": depth, "row": row, "seed": seed, "updates": budget,
            "codes": [short.get("code"), long.get("code")],
            "threads": [short.get("threads"), long.get("threads")],
            "valid_bits": [short["valid_bits"],
                           curve["valid_bits"][curve["updates"].index(budget)]],
            "train_losses_equal": bool(losses) and long["train_losses"][:len(losses)] == losses})
    if not checks:
        return None, []
    lines = ["### Do the longer runs start as the shorter ones?", "",
             "Each run's validation bits at the shorter budget's last update (its curve point) "
             f"against the shorter run's ({args.shorter_runs}), and whether the logged training "
             "losses of the shorter run (3 decimals, every logged update) are the longer run's "
             "first ones; the code and threads of both.", "",
             "| blocks | row | seed | updates | short code | long code | threads | valid bits "
             "short | long | difference | losses equal |", "|---:|---|---:|---:|---|---|---|"
             "---:|---:|---:|:-:|"]
    for c in checks:
        lines.append(f"| {c['depth']} | {c['row']} | {c['seed']} | {c['updates']} | "
                     f"{c['codes'][0]} | {c['codes'][1]} | {c['threads'][0]} / {c['threads'][1]}"
                     f" | {c['valid_bits'][0]:.5f} | {c['valid_bits'][1]:.5f} | "
                     f"{c['valid_bits'][1] - c['valid_bits'][0]:+.5f} | "
                     f"{'yes' if c['train_losses_equal'] else 'no'} |")
    return checks, lines + [""]


def curves_figure(args, report):
    """Every row's learning curve as its difference from the baseline (mean and the seeds'
    range), one panel per depth: ``curves.png`` in the output folder; False without curves."""
    panels = [(f"{depth} blocks", {row: (c["updates"], c["delta_mean"], c["delta_low"],
                                         c["delta_high"]) for row, c in rows.items()})
              for depth, rows in report.get("curves", {}).items()]
    return figures.curve_differences(
        panels, os.path.join(args.out_dir, "curves.png"),
        f"validation bits minus the baseline's (same seed), {args.updates} updates: mean and "
        "range over seeds")


def first_seed_analyses(args, plan, depth):
    """[(row, its first seed's layer analysis)] of the rows at ``depth`` that have one."""
    out = []
    for d, row in plan:
        path = os.path.join(args.out_dir, f"d{d}", row, f"seed{args.seeds[0]}", "analysis",
                            "analysis.json")
        if d == depth and os.path.exists(path):
            with open(path) as f:
                out.append((row, next(iter(json.load(f)["analyses"].values()))))
    return out


def layers_figure(args, plan, depth):
    """What the layers of every row's first seed hold (logit lens, CKA of consecutive states,
    update norms): ``layers_d<depth>.png`` in the output folder; False when no row has them."""
    analyses = first_seed_analyses(args, plan, depth)
    # ar_encdec_lm: its decoder stack (what the output reads) drawn above its encoder's blocks
    offsets = {row: depth // 2 for row, _ in analyses
               if row_spec(row, depth, args.embed_dim)[0] == "ar_encdec_lm"}
    return figures.layer_profiles(
        analyses, os.path.join(args.out_dir, f"layers_d{depth}.png"),
        f"what the layers hold, {depth} blocks (seed {args.seeds[0]}, 256 validation blocks; "
        "ar_encdec_lm: its decoder stack)", offsets)


def weights_figure(args, plan, depth):
    """The learned connection weights of every row's first seed (its analysis), one panel per
    row and stack: ``weights_d<depth>.png`` in the output folder; False when no row has any."""
    panels = []
    for row, analysis in first_seed_analyses(args, plan, depth):
        for stack, weights in analysis.get("layer_weights", {}).get("depth_connections",
                                                                     {}).items():
            # one panel per kind of weight (AttnRes's per-source means; the Amax gains apart)
            weights = {k.split(".", 1)[-1]: v for k, v in weights.items() if "amax" not in k}
            panels.append((f"{row}: {stack} (seed {args.seeds[0]})", weights))
    return figures.connection_weights(
        panels, os.path.join(args.out_dir, f"weights_d{depth}.png"),
        f"learned connection weights, {depth} blocks (after training, on validation blocks)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="data-bin/wikitext-2")
    p.add_argument("--out-dir", default="outputs/lm-depth")
    p.add_argument("--rows", type=parse_list, default=list(ROWS))
    p.add_argument("--depths", type=lambda t: parse_list(t, int), default=[4, 12])
    p.add_argument("--seeds", type=lambda t: parse_list(t, int), default=[1, 2, 3])
    p.add_argument("--updates", type=int, default=800)
    p.add_argument("--warmup-updates", type=int,
                   help="warm-up updates of the inverse-sqrt schedule (default: --updates / 8; "
                        "the schedule does not depend on --updates otherwise, so a longer run "
                        "with the same warm-up trains its first updates as the shorter one)")
    p.add_argument("--log-interval", type=int,
                   help="a training-loss record every N updates (default: --updates / 20)")
    p.add_argument("--curve-interval", type=int, default=0,
                   help="the learning curve: the full validation set scored every N updates "
                        "(a multiple of --save-interval-updates), kept in each run's result; "
                        "0: none")
    p.add_argument("--test-at", type=lambda t: parse_list(t, int), default=[],
                   metavar="UPDATES",
                   help="also score the test set with the checkpoints of these curve points "
                        "(kept as test_blocks_<N>.npy; not part of the recipe): the report then "
                        "sets each row's difference from the baseline at N beside the one at "
                        "the end, within the same runs (e.g. 800: the shorter comparison's "
                        "budget, at a depth it did not train)")
    p.add_argument("--allocator", choices=sorted(ALLOCATORS), default="retain",
                   help="glibc's malloc settings for fairseq-train: retain (keep freed memory "
                        "for reuse instead of unmapping it: no page faults on every step; the "
                        "same arithmetic) or default")
    p.add_argument("--embed-dim", type=int, default=128)
    p.add_argument("--no-matched-baselines", action="store_true")
    p.add_argument("--results-name", help="also copy the tables to results/NAME.{json,md}")
    p.add_argument("--save-interval-updates", type=int, default=100,
                   help="a checkpoint every N updates, from which an interrupted run continues "
                        "(0: none; not part of the recipe: it does not change the run)")
    runner.add_launcher_arguments(p)  # --threads: default the machine's cores / --jobs
    p.add_argument("--keep-runs", metavar="DIR",
                   help="also keep every finished run's result, test-block scores and (first "
                        "seed) layer analysis in DIR, and take finished runs from there: a "
                        "committed DIR lets a fresh clone resume the comparison")
    p.add_argument("--shorter-report", metavar="FILE",
                   help="also compare every row's difference from the baseline with the one in "
                        "this report of a shorter training (e.g. "
                        "results/lm_depth_comparison_cpu.json, 800 updates)")
    p.add_argument("--shorter-runs", metavar="DIR",
                   help="also check that each run's curve point at a shorter run's last update "
                        "reproduces that run (its kept runs, e.g. results/lm_depth_runs)")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: the tables of the runs finished so far (each row over "
                        "the seeds it has)")
    args = p.parse_args(argv)
    args.command = " ".join(["python scripts/experiments/lm_depth_comparison.py",
                             *(sys.argv[1:] if argv is None else map(str, argv))])
    try:
        # the launcher's flags (its own checks), refused before check_inputs writes anything
        launcher = runner.launcher_from_args(args, os.path.join(args.out_dir, "submitit"),
                                             runner.shared_cores(args.jobs))
        args.threads = launcher.cpus  # per run
        check_inputs(args)
    except (InputError, runner.PlanError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from fairseq.data import Dictionary

    dictionary = Dictionary.load(os.path.join(args.data, "dict.txt"))
    for depth in args.depths:
        if "attn_res_block" in args.rows and depth % 2:
            print(f"error: attn_res_block uses 2 groups: depth {depth} is odd", file=sys.stderr)
            return 2
    # the declaration: the settings are the depths, every run in <out>/d<depth>/<row>/seed<N>
    comparison = runner.Comparison(
        "lm_depth_comparison", [runner.Row(row, ROWS[row][0], tuple(ROWS[row][1]))
                                for row in args.rows],
        args.depths, args.seeds, BASELINE,
        layout=lambda depth, row, seed: os.path.join(f"d{depth}", row, f"seed{seed}"))
    matched_of = {}  # (depth, row) -> its matched-parameter baseline
    if not args.no_matched_baselines:
        def params(row, depth):
            return parameters(*row_spec(row.name, depth, args.embed_dim), dictionary)

        base_params = {}

        def matched(depth, target):
            # the target as the committed runs had it: the baseline's count times one plus the
            # row's excess, in floating point. LRF's count lies exactly between two widths at
            # 4 and at 12 blocks; that product's last bit made 4 blocks' 771 (at 12 the tie
            # went to the even 770): kept, so that the matched runs trained stay the matched
            # ones
            base = base_params.setdefault(depth, parameters(
                *row_spec(BASELINE, depth, args.embed_dim), dictionary))
            target = base * (1 + (target / base - 1))
            return runner.Row(f"{BASELINE}_ffn"
                              f"{matched_ffn(target, depth, args.embed_dim, dictionary)}",
                              "gpt_baseline_lm")
        matched_of = {(depth, row): name for depth, rows in runner.add_matched_baselines(
            comparison, params, matched, MATCH_ABOVE).items() for row, name in rows.items()}
    plan = [(depth, row.name) for depth in args.depths for row in comparison.rows_in(depth)]
    # seed by seed, and within a seed depth by depth: a comparison stopped part-way has every
    # row at the first seeds (at every depth) rather than some rows at every seed and others
    # at none
    order = comparison.plan(args.out_dir)

    def recipe_of(depth, row):  # as JSON stores it (a finished run's recipe is compared with it)
        recipe = {"updates": args.updates, "embed_dim": args.embed_dim, "context": CONTEXT,
                  "batch": BATCH, "spec": row_spec(row, depth, args.embed_dim),
                  "recipe": args_recipe_flags(args)}
        if args.curve_interval:  # a run without the curve is not one with it
            recipe["curve_interval"] = args.curve_interval
        return json.loads(json.dumps(recipe))

    recipe_by_run = {run.key: recipe_of(run.setting, run.row.name) for run in order}
    results = {}
    # a finished run of another recipe (another --updates, warm-up, curve) is never mixed into
    # this table: one line, before anything trains
    try:
        for run in order:
            done = finished_run(run.run_dir, kept_dir(args, run), recipe_by_run[run.key])
            if done is not None:
                results[run.key] = done
    except runs.OtherRecipe as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.report_only:
        # two processes training into one folder would train the same runs over each other
        lock = runs.exclusive_lock(os.path.join(args.out_dir, ".lock"))
        if lock is None:
            print(f"error: another lm_depth_comparison.py is training into {args.out_dir} "
                  "(wait for it, stop it, or use another --out-dir)", file=sys.stderr)
            return 2
        # nor two into one --keep-runs from two --out-dirs: both would train the runs that
        # neither has kept yet, and two processes on the same cores each take threads sized for
        # the machine alone (the folder itself is locked: nothing is written into it)
        kept_lock = runs.exclusive_lock(args.keep_runs) if args.keep_runs else None
        if args.keep_runs and kept_lock is None:
            lock.close()
            print(f"error: another lm_depth_comparison.py keeps its runs in {args.keep_runs} "
                  "(wait for it, stop it, or use another --keep-runs)", file=sys.stderr)
            return 2
        # the runs' threads: fairseq-train (a subprocess) reads OMP_NUM_THREADS, the scoring
        # here torch's setting
        import torch

        saved = ({name: os.environ.get(name) for name in ("OMP_NUM_THREADS",
                                                          *ALLOCATORS["retain"])},
                 torch.get_num_threads())
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        # glibc reads its malloc settings when a process starts: they reach fairseq-train
        for name in ALLOCATORS["retain"]:
            os.environ.pop(name, None)
        os.environ.update(ALLOCATORS[args.allocator])
        torch.set_num_threads(args.threads)
        position = {run.key: index for index, run in enumerate(order)}

        def started(run):
            depth, row, seed = run.key
            print(f"[{position[run.key] + 1}/{len(order)}] {row} at {depth} blocks, "
                  f"seed {seed}", file=sys.stderr, flush=True)

        def done(run):
            # a finished run is not submitted again, unless it lacks a --test-at point (its
            # work trains it again to the point)
            result = results.get(run.key)
            return None if result is None or missing_test_at(args, run.run_dir, result) \
                else result
        try:
            results.update(runner.launch(order, work, (args, recipe_by_run), launcher,
                                         done=done, on_submit=started))
        except runner.RunFailed as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        finally:  # as they were (main() also runs in-process, e.g. in the tests)
            for name, value in saved[0].items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            torch.set_num_threads(saved[1])
            lock.close()
            if kept_lock is not None:
                kept_lock.close()
    report, table = summarise(args, results, plan, matched_of)
    extra = []
    if args.shorter_report:
        report["budgets"], lines = budget_lines(args, report)
        extra += lines
    if args.shorter_runs:
        report["reproduction"], lines = reproduction_lines(args, results)
        extra += lines
    if args.test_at:
        report["within_runs"], lines = within_run_lines(args, report)
        extra += lines
    table = "\n".join([table, *extra])
    figures_made = [(kind, d) for d in args.depths
                    for kind, make in (("weights", weights_figure), ("layers", layers_figure))
                    if make(args, plan, d)]
    curves_made = curves_figure(args, report)
    with open(os.path.join(args.out_dir, "results.json"), "w") as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(args.out_dir, "results.md"), "w") as f:
        f.write(table + "\n")
    if args.results_name:
        for ext in ("json", "md"):
            shutil.copy(os.path.join(args.out_dir, f"results.{ext}"),
                        os.path.join(paths.RESULTS, f"{args.results_name}.{ext}"))
        for kind, depth in figures_made:
            shutil.copy(os.path.join(args.out_dir, f"{kind}_d{depth}.png"),
                        os.path.join(paths.RESULTS, f"{args.results_name}_{kind}_d{depth}.png"))
        if curves_made:
            shutil.copy(os.path.join(args.out_dir, "curves.png"),
                        os.path.join(paths.RESULTS, f"{args.results_name}_curves.png"))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
