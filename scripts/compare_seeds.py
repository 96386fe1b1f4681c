#!/usr/bin/env python3
"""Train several architectures with several seeds on one data-bin and score them: mean and spread.

    python scripts/compare_seeds.py --data data-bin/scan-length --archs transformer_tiny,\\
        swapped_transformer_tiny --seeds 1,2,3 --metric exact_match --out-dir outputs/cmp
    python scripts/compare_seeds.py --data data-bin/multi30k --metric bleu \\
        --spm data/multi30k/spm.model --ref data/multi30k/test.raw.en ...

Every run goes through the real CLIs (fairseq-train --user-dir, fairseq-generate) with one of
two optimisation recipes (``layerlab.recipes``): ``--recipe inverse_sqrt`` (default; Adam,
inverse-sqrt schedule, no validation, the last checkpoint) or ``--recipe linear_decay`` (the
quickstart's: Adam, learning rate decayed linearly to 0 at ``--max-update``, greedy validation
exact match every ``--validate-every`` updates, the best checkpoint), dropout 0 unless
``--train-args`` says otherwise. ``--jobs N`` trains N runs at a time with one CPU thread each
(``--threads`` sets another count; with one job, torch's default unless given).
Finished runs (a ``result.json`` in their directory, with the flags they were made with) are
not repeated when the command is run again; a finished run made with other flags is an error,
not a reused number. The runs go through the experiment runner (``layerlab.runner``, submitit):
``--launcher local`` (this machine, ``--jobs`` runs at a time, one thread each) or ``--launcher
slurm`` (one job per run: ``--slurm-partition``, ``--gpus-per-run``, ``--time-limit``); every
architecture is built once with the run's flags before anything trains, and one it refuses
stops the command with one line naming it. Writes ``results.json`` and ``results.md`` (mean, sample standard deviation
and every seed's value per architecture; each row's difference to ``--baseline`` with a 95%
interval from a bootstrap over test sentences and seeds together, see layerlab/significance.py;
training time relative to the baseline's) and ``results.png`` (bars with the seed spread).
"""
import argparse
import datetime
import json
import logging
import os
import shlex
import statistics
import sys

from layerlab import figures, recipes, runner, runs, significance, stats

# fairseq's models call logging.basicConfig when imported (its text_to_speech task at INFO, its
# wav2vec2 classification at DEBUG: matplotlib's font search in the report); configuring logging
# first makes those calls no-ops, so warnings and errors stay one line each
logging.basicConfig(level=logging.WARNING, format="%(message)s")


def recipe(arch, args):
    """Everything that makes a run's number: its fairseq-train and fairseq-generate flags and the
    checkpoint it generates with (stored in ``result.json``; resuming needs the same)."""
    spm = ["--bpe", "sentencepiece", "--sentencepiece-model", args.spm] if args.spm else []
    if args.recipe == "linear_decay":
        flags = recipes.linear_decay_exact_match(
            args.lr, args.max_tokens, args.max_update, args.validate_every, warmup=args.warmup,
            max_output_len=args.max_len_b)
        checkpoint = "checkpoint_best.pt"
    else:
        flags = recipes.adam_inverse_sqrt(args.lr, args.max_tokens, args.max_update,
                                          warmup=args.warmup)
        checkpoint = "checkpoint_last.pt"
    return {"train": ["--arch", arch, *flags, *shlex.split(args.train_args)],
            "generate": ["--beam", str(args.beam), "--batch-size", "128",
                         "--max-len-a", str(args.max_len_a), "--max-len-b", str(args.max_len_b),
                         *spm],
            "subset": args.gen_subset, "checkpoint": checkpoint}


def run_work(run, args):
    """The runner's work for one run (submitit pickles it with the comparison's options)."""
    return run_one(run.row.name, run.seed, args)


def build_check(args):
    """``build(row, setting)`` for the runner's check: the row's model as fairseq-train would
    build it from the run's flags, over the data's dictionaries."""
    import glob

    from fairseq.data import Dictionary

    from fairseq_plugins import inprocess

    found = sorted(glob.glob(os.path.join(args.data, "dict.*.txt")))
    dicts = [Dictionary.load(path) for path in found[:2]] if len(found) >= 2 else [None, None]

    def build(row, setting):
        flags = recipe(row.arch, args)["train"]
        inprocess.build_translation_model(row.arch, flags, *dicts)
    return build


def finished_result(args):
    """The runner's ``done``: a finished run's result, checked against this recipe (a run
    made with other flags raises runs.OtherRecipe, naming it)."""
    def done(run):
        return runs.load_result(run.run_dir, recipe(run.row.name, args))
    return done


def run_one(arch, seed, args):
    run_dir = os.path.join(args.out_dir, f"{arch}-seed{seed}")
    made = recipe(arch, args)
    done = runs.load_result(run_dir, made)
    if done is not None:
        return done
    return runs.train_generate_score(
        run_dir, args.data, seed, made["train"], args.gen_subset, made["generate"], args.metric,
        ref=args.ref, resume=False, info={"arch": arch, "recipe": made},
        checkpoint=made["checkpoint"])


def compare_to_baseline(summary, rows, args):
    """Each row's difference to the baseline (bootstrap over sentences and seeds) and training
    time ratio, added to its summary."""
    def run_stats(arch):
        return [significance.sentence_stats(args.metric, *runs.generation(
                    os.path.join(args.out_dir, f"{arch}-seed{r['seed']}",
                                 f"generate-{args.gen_subset}.txt"), args.ref))
                for r in rows if r["arch"] == arch]

    def train_seconds(arch):
        return statistics.mean(r["train_seconds"] for r in rows if r["arch"] == arch)

    base = run_stats(args.baseline)
    for s in summary:
        s["train_time_ratio"] = round(train_seconds(s["arch"]) / train_seconds(args.baseline), 2)
        if s["arch"] != args.baseline and args.bootstrap:
            s["vs_baseline"] = significance.hierarchical_bootstrap(
                args.metric, run_stats(s["arch"]), base, replicates=args.bootstrap)


def markdown(summary, args):
    name = "exact match %" if args.metric == "exact_match" else "BLEU"
    schedule = ("linear decay to 0, best checkpoint by greedy valid exact match every "
                f"{args.validate_every} updates" if args.recipe == "linear_decay" else
                "inverse-sqrt schedule, last checkpoint")
    lines = [f"`{args.data}` {args.gen_subset}, {args.max_update} updates x {args.max_tokens} "
             f"tokens, lr {args.lr} ({args.warmup} warm-up updates, {schedule}), "
             f"{'greedy' if args.beam == 1 else f'beam {args.beam}'}, seeds {args.seeds}"
             + (f", extra train flags `{args.train_args}`" if args.train_args else ""), "",
             f"| arch | {name} mean | std | per seed | vs {args.baseline} [95% interval] | "
             "beyond noise | final train loss (bits/token) | params | train time ratio |",
             "|---|---:|---:|---|---:|:---:|---:|---:|---:|"]
    for s in summary:
        vs = s.get("vs_baseline")
        diff = f"{vs['difference']:+.2f} [{vs['low']:+.2f}, {vs['high']:+.2f}]" if vs else "-"
        beyond = ("yes" if vs["larger_than_noise"] else "no") if vs else "-"
        lines.append(f"| {s['arch']} | {s['mean']:.2f} | {s['std']:.2f} | "
                     f"{', '.join(f'{v:.2f}' for v in s['values'])} | {diff} | {beyond} | "
                     f"{s['train_loss_bits_mean']} | {s['params']:,} | "
                     f"{s.get('train_time_ratio', '-')} |")
    if args.bootstrap:
        lines += ["", f"Interval: {args.bootstrap} bootstrap replicates drawing the test sentences "
                  "(the same for every run) and, per row, the seeds, with replacement "
                  "(layerlab/significance.py); \"beyond noise\": the interval excludes 0. "
                  "Training time: mean seconds per run over the baseline's, on this machine as "
                  "it was (not a benchmark; scripts/bench/ measures speed)"
                  + (f", {args.jobs} runs at a time with {args.threads or 1} thread(s) each."
                     if args.jobs > 1 else f", {args.threads} thread(s)." if args.threads
                     else ".")]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="fairseq data-bin (translation)")
    p.add_argument("--archs", required=True, help="comma-separated --arch names")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--metric", choices=("exact_match", "bleu"), default="exact_match")
    p.add_argument("--spm", help="SentencePiece model: detokenise hypotheses for BLEU")
    p.add_argument("--ref", help="raw reference file for BLEU (default: the T- lines)")
    p.add_argument("--gen-subset", default="test")
    p.add_argument("--max-update", type=int, default=2000)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--recipe", choices=("inverse_sqrt", "linear_decay"), default="inverse_sqrt",
                   help="optimisation recipe (layerlab/recipes.py); linear_decay validates by "
                        "exact match and needs --metric exact_match")
    p.add_argument("--warmup", type=int, default=200, help="warm-up updates")
    p.add_argument("--validate-every", type=int,
                   help="--recipe linear_decay: updates between validations (default 500)")
    p.add_argument("--beam", type=int, default=5, help="fairseq-generate --beam (1: greedy)")
    runner.add_launcher_arguments(p)  # --jobs above 1: one CPU thread each unless --threads
    p.add_argument("--max-len-a", type=float, default=1.2,
                   help="fairseq-generate --max-len-a (SCAN: 0, its outputs are up to 48 tokens)")
    p.add_argument("--max-len-b", type=int, default=10, help="fairseq-generate --max-len-b "
                   "(SCAN: 64)")
    p.add_argument("--train-args", default="", help="extra fairseq-train flags (one string)")
    p.add_argument("--baseline", help="the row the others are compared with (default: the "
                   "first of --archs)")
    p.add_argument("--bootstrap", type=int, default=1000,
                   help="bootstrap replicates for the comparison with --baseline (0: none)")
    p.add_argument("--plot", help="bar chart of the rows (default: OUT_DIR/results.png)")
    p.add_argument("--out-dir", required=True)
    args = p.parse_args(argv)
    archs = args.archs.split(",")
    args.baseline = args.baseline or archs[0]
    if args.baseline not in archs:
        p.error(f"--baseline {args.baseline} is not one of --archs")
    if args.recipe == "linear_decay":
        if args.metric != "exact_match":
            p.error("--recipe linear_decay validates by exact match: it needs --metric "
                    "exact_match")
        args.validate_every = args.validate_every or 500
    elif args.validate_every is not None:
        p.error("--validate-every needs --recipe linear_decay (inverse_sqrt does not validate)")
    if args.beam < 1:
        p.error("--beam must be at least 1")
    try:  # the launcher's flags (--jobs, --launcher slurm's), before anything is created
        launcher = runner.launcher_from_args(args, os.path.join(args.out_dir, "submitit"))
    except runner.PlanError as e:
        p.error(str(e))
    if not os.path.isdir(args.data):
        p.error(f"--data {args.data} is not a directory (prepare it with scripts/prepare/)")
    seeds = [int(s) for s in args.seeds.split(",")]
    os.makedirs(args.out_dir, exist_ok=True)
    # the code the runs use is the code at the start (a long comparison may outlive later edits)
    command = " ".join(["python scripts/compare_seeds.py",
                        *map(shlex.quote, sys.argv[1:] if argv is None else argv)])
    provenance = {"command": command, "package_version": runs.package_version(),
                  "date": datetime.date.today().isoformat()}
    comparison = runner.Comparison(
        "compare_seeds", [runner.Row(arch, arch) for arch in archs], ["data"], seeds,
        args.baseline, layout=lambda setting, row, seed: f"{row}-seed{seed}")
    try:
        comparison.check(build_check(args))
    except runner.PlanError as e:
        p.error(str(e))
    plan = comparison.plan(args.out_dir)
    # arch by arch, as before (the runner's seed-by-seed order suits long comparisons)
    plan.sort(key=lambda run: (archs.index(run.row.name), run.seed))
    print(f"[compare] {len(plan)} runs, {args.jobs} at a time ({args.launcher}) ...", flush=True)

    def report(run, result):
        print(f"[compare] {run.row.name} seed {run.seed}: {args.metric} {result[args.metric]}",
              flush=True)
    try:
        done = runner.launch(plan, run_work, (args,), launcher, on_result=report,
                             done=finished_result(args))
    except (runner.RunFailed, runs.StepError) as e:
        raise SystemExit(f"compare_seeds: {e}") from None
    rows = [done[run.key] for run in plan]
    summary = stats.summarise(rows, args.metric)
    compare_to_baseline(summary, rows, args)
    table = markdown(summary, args)
    figures.seed_bars(summary, "exact match %" if args.metric == "exact_match" else "BLEU",
                      args.plot or os.path.join(args.out_dir, "results.png"),
                      f"{args.data} {args.gen_subset}, seeds {args.seeds}")
    made_with = sorted({r.get("package_version", "not recorded") for r in rows})
    table += (f"\n\nCommand: `{command}`  \nLaunched with fairseq_plugins "
              f"{provenance['package_version']}, {provenance['date']}; the runs were made with "
              f"{', '.join(made_with)} (finished runs are not repeated)")
    with open(os.path.join(args.out_dir, "results.json"), "w") as f:
        json.dump({"config": vars(args), **provenance, "runs": rows, "summary": summary}, f,
                  indent=2)
    with open(os.path.join(args.out_dir, "results.md"), "w") as f:
        f.write(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
