#!/usr/bin/env python3
"""Quickstart: SCAN -> train fairseq's transformer, layer-wise fusion (LRF) and the FC bridge
until SCAN is learned -> exact match with fairseq-generate -> markdown table + JSON -> the layer
analysis of the trained models (scripts/analyze_layers.py) -> what they show, in two sentences.

Everything runs through the real CLIs (fairseq-preprocess, fairseq-train --user-dir,
fairseq-generate --user-dir). Each row trains for a fixed budget whose learning rate decays
linearly to 0 (``--max-update``), so that it ends converged: greedy exact match on the validation
subset every ``--validate-every`` updates shows the plateau, and the test set is decoded greedily
with the best checkpoint.
``--all`` trains every ``*_tiny`` encoder-decoder preset of this package (but
``layerwise_transformer_tiny``, which is fairseq's ``transformer_tiny`` with every switch off).
``--seeds 1,2,3`` trains each row once per seed and reports mean, sample std and the per-seed
values: how the committed copy (results/quickstart_cpu.*) was made. docs/quickstart.md has the
measured times and the seed spread.
"""
import argparse
import json
import logging
import os
import subprocess
import sys
import time

from layerlab import fairseq_log, paths, recipes, runs, stats
from layerlab.progress import TrainingProgress

# the default rows: the transformer and the package's two original ideas (docs/ideas/)
DEFAULT_ARCHS = ["transformer_tiny", "fusion_transformer_tiny", "bridge_transformer_tiny"]
# every row: the tiny presets with a wider FFN (the presets' 64 learns SCAN far more slowly)
SIZE_FLAGS = ["--encoder-ffn-embed-dim", "256", "--decoder-ffn-embed-dim", "256"]
MAX_OUTPUT_LEN = 64  # SCAN actions are at most 48 tokens; the cap only matters for bad models
COMMITTED = os.path.join(paths.RESULTS, "quickstart_cpu.json")
LEARNED = 95.0  # test exact match (%) from which a row counts as having learned SCAN simple

# fairseq's text_to_speech task calls logging.basicConfig(level=INFO) when fairseq is imported;
# configuring logging first keeps the quickstart's own progress lines readable
logging.basicConfig(level=logging.WARNING, format="%(message)s")


def seq2seq_tiny_archs():
    """fairseq's transformer_tiny first, then this package's encoder-decoder *_tiny presets."""
    import fairseq_plugins  # noqa: F401
    from fairseq.models import ARCH_MODEL_REGISTRY, FairseqEncoderDecoderModel

    ours = sorted(
        name for name, cls in ARCH_MODEL_REGISTRY.items()
        if name.endswith("_tiny") and cls.__module__.split(".")[0] == "fairseq_plugins"
        and issubclass(cls, FairseqEncoderDecoderModel) and name != "layerwise_transformer_tiny"
    )
    return ["transformer_tiny"] + ours


def validation_curve(train_log):
    """A run's validation from its log: the updates trained, the curve [(update, exact match)]
    and its best and final values (their closeness is the plateau)."""
    curve = [(int(r["valid_num_updates"]), float(r["valid_exact_match"]))
             for r in fairseq_log.records(train_log, "valid") if "valid_exact_match" in r]
    last = fairseq_log.last_record(train_log, "train") or {}
    updates = int(last.get("train_num_updates", curve[-1][0] if curve else 0))
    return {"updates": updates, "valid_curve": curve,
            "best_valid_exact_match": max((em for _, em in curve), default=None),
            "final_valid_exact_match": curve[-1][1] if curve else None}


def run_dir_of(out_dir, arch, seed):
    return os.path.join(out_dir, f"{arch}-seed{seed}")


def train_and_evaluate(arch, seed, data, out_dir, args):
    """One architecture and seed, from scratch (the quickstart measures times), or with
    ``--resume`` the finished run in ``out_dir`` when it was made with the same recipe."""
    run_dir = run_dir_of(out_dir, arch, seed)
    done = runs.load_result(run_dir, recipe(args)) if args.resume else None
    if done is not None:
        return dict(done, resumed=True)
    result = runs.train_generate_score(
        run_dir, data, seed,
        ["--arch", arch, *SIZE_FLAGS,
         *recipes.linear_decay_exact_match(args.lr, args.max_tokens, args.max_update,
                                           args.validate_every, warmup=args.warmup,
                                           max_output_len=MAX_OUTPUT_LEN)],
        args.gen_subset,
        # greedy: on SCAN, fairseq's beam search with its length normalisation loses 6-16
        # points of exact match against greedy decoding of the same checkpoint
        # (docs/quickstart.md)
        ["--beam", "1", "--batch-size", "256", "--max-len-a", "0",
         "--max-len-b", str(MAX_OUTPUT_LEN)],
        "exact_match", resume=False, info={"arch": arch, "recipe": recipe(args)},
        checkpoint="checkpoint_best.pt")
    result.update(validation_curve(os.path.join(run_dir, "train.log")))
    return runs.save_result(run_dir, result)


def recipe(args):
    return {"split": args.split, "gen_subset": args.gen_subset, "lr": args.lr,
            "max_tokens": args.max_tokens, "max_update": args.max_update, "warmup": args.warmup,
            "validate_every": args.validate_every, "size_flags": " ".join(SIZE_FLAGS)}


def committed_rows(args):
    """{arch: summary} of the committed multi-seed copy when it was made with this recipe,
    else {} (a different recipe's numbers are not a reference)."""
    if not os.path.exists(COMMITTED):
        return {}
    with open(COMMITTED) as f:
        committed = json.load(f)
    if any(committed["recipe"].get(k) != v for k, v in recipe(args).items()):
        return {}
    return {s["arch"]: s for s in committed["summary"]}


def summarise(results, archs):
    summary = []
    for arch in archs:
        own = [r for r in results if r["arch"] == arch]
        mean, std = stats.mean_std([r["exact_match"] for r in own])
        summary.append({"arch": arch, "seeds": [r["seed"] for r in own],
                        "values": [r["exact_match"] for r in own], "mean": mean, "std": std,
                        "final_valid": [r["final_valid_exact_match"] for r in own],
                        "params": own[0]["params"],
                        "train_seconds": [r["train_seconds"] for r in own]})
    return summary


def markdown(results, summary, committed, args, wall_seconds):
    seeds = sorted({r["seed"] for r in results})
    resumed = sum(r.get("resumed", False) for r in results)
    head = (f"SCAN `{args.split}` {args.gen_subset}, greedy, best checkpoint by greedy "
            f"validation exact match (every {args.validate_every} updates); {args.max_update} "
            f"updates x {args.max_tokens} tokens, Adam lr {args.lr} (warm-up {args.warmup}, "
            "then linear decay to 0), tiny presets with "
            f"`{' '.join(SIZE_FLAGS)}`, seed{'s' if len(seeds) > 1 else ''} "
            f"{','.join(map(str, seeds))}; {wall_seconds / 60:.1f} minutes in all (CPU)"
            + (f", {resumed} of {len(results)} runs resumed from an earlier invocation (their "
               "seconds are their own)" if resumed else ""))
    lines = [head, ""]
    if len(seeds) > 1:
        lines += ["| arch | exact match % (mean ± sample std) | per seed | final validation % "
                  "(per seed) | params | train s (per seed) |",
                  "|---|---:|---:|---:|---:|---:|"]
        for s in summary:
            lines.append(f"| {s['arch']} | {stats.fmt(s['mean'], s['std'])} | "
                         f"{' / '.join(f'{v:.2f}' for v in s['values'])} | "
                         f"{' / '.join(f'{v:.1f}' for v in s['final_valid'])} | "
                         f"{s['params']:,} | "
                         f"{' / '.join(f'{t:.0f}' for t in s['train_seconds'])} |")
        return "\n".join(lines)
    lines += ["| arch | exact match % | correct / total | validation % (last two checks) "
              "| committed: mean ± std (this seed) | params | train s | generate s |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        c = committed.get(r["arch"])
        ref = "n/a"
        if c:
            same_seed = dict(zip(c["seeds"], c["values"])).get(r["seed"])
            ref = stats.fmt(c["mean"], c["std"]) + (f" ({same_seed:.2f})" if same_seed is not None
                                                    else "")
        lines.append(f"| {r['arch']} | {r['exact_match']:.2f} | {r['correct']} / {r['total']} | "
                     f"{' -> '.join(f'{em:.1f}' for _, em in r['valid_curve'][-2:])} | "
                     f"{ref} | {r['params']:,} | "
                     f"{r['train_seconds']} | {r['generate_seconds']} |")
    return "\n".join(lines)


def span(values, digits=0):
    """``lo-hi`` of the values (one number when they round alike)."""
    lo, hi = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return lo if lo == hi else f"{lo}-{hi}"


def two_sentences(summary, analysis, committed):
    """What the table and the figure show, from this run's numbers (docs/quickstart.md)."""
    learned = [s for s in summary if s["mean"] is not None and s["mean"] >= LEARNED]
    low = [s for s in summary if s not in learned]
    text = (f"Table: {len(learned)} of {len(summary)} models learned SCAN {{split}} (test exact "
            f"match {span([s['mean'] for s in learned], 1)}%"
            if learned else f"Table: none of the {len(summary)} models reached {LEARNED:.0f}% "
            f"(test exact match {span([s['mean'] for s in summary], 1)}%")
    if low and learned:
        text += "; below " + f"{LEARNED:.0f}%: " + ", ".join(
            f"{s['arch']} {s['mean']:.1f}%" for s in low)
    own = [s["std"] for s in summary if len(s.get("values", ())) > 1]
    spread = own or [c["std"] for c in committed.values() if c.get("std") is not None]
    if spread:
        limit = 2 * max(spread)
        means = sorted((s["mean"], s["arch"]) for s in summary)
        gap = means[-1][0] - means[0][0]
        text += (f"), and with a seed spread (sample std) of up to {max(spread):.1f} points "
                 f"({'this run' if own else 'the committed 3-seed runs'}) differences below "
                 f"about {limit:.1f} points are not a ranking"
                 + (": the rows are not told apart." if gap < limit or len(means) < 2 else
                    f"; {means[-1][1]} and {means[0][1]} are {gap:.1f} points apart."))
    else:
        text += ("); one seed per row cannot separate rows closer than the seed spread (run "
                 "--seeds 1,2,3).")
    lens = {label: a["logit_lens"]["accuracy"] for label, a in analysis["analyses"].items()
            if a.get("logit_lens")}
    if lens:
        first = [acc[1] for acc in lens.values() if len(acc) > 1]
        last = [acc[-1] for acc in lens.values()]
        top_heavy = all(acc[-1] - acc[-2] > acc[-2] - acc[0] for acc in lens.values()
                        if len(acc) > 2)
        text += (" Figure: read out through the output layer (logit lens), the decoder's first "
                 f"layer predicts {span(first)}% of the test tokens and its last {span(last)}%, "
                 + ("so in every model the last decoder layer adds most of the accuracy"
                    if top_heavy else "so the accuracy builds up over the decoder's layers")
                 + "; the other panels show how similar the layers' states are (CKA), how much "
                 "each sub-layer changes the residual stream, and how focused each decoder "
                 "layer's cross-attention is (docs/analysis.md explains each panel).")
    return text


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--split", default="simple", help="SCAN split (default: simple)")
    p.add_argument("--all", action="store_true",
                   help="every *_tiny encoder-decoder preset, not only the three default rows")
    p.add_argument("--archs", default=None,
                   help=f"comma-separated rows (default: {','.join(DEFAULT_ARCHS)})")
    p.add_argument("--seeds", default="1",
                   help="comma-separated seeds; more than one: mean, std and per-seed values")
    p.add_argument("--max-update", type=int, default=3000,
                   help="updates per row; the learning rate reaches 0 at the last")
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--validate-every", type=int, default=500,
                   help="updates between validations (exact match on the valid subset)")
    p.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)),
                   help="runs trained at the same time, one CPU thread each (default: the "
                        "number of CPU cores available)")
    p.add_argument("--gen-subset", default="test", help="subset scored for exact match")
    p.add_argument("--resume", action="store_true",
                   help="reuse finished runs of the same recipe in --out-dir (their times are "
                        "those of their own run)")
    p.add_argument("--no-analysis", action="store_true", help="skip the layer analysis")
    p.add_argument("--out-dir", default=os.path.join("outputs", "quickstart"))
    args = p.parse_args(argv)
    if args.all and args.archs:
        p.error("--all and --archs exclude each other")
    if args.jobs < 1:
        p.error("--jobs must be at least 1")
    seeds = [int(s) for s in args.seeds.split(",")]
    start = time.time()

    data = os.path.join("data-bin", f"scan-{args.split}")
    print(f"[1/4] SCAN {args.split} -> {data}", flush=True)
    subprocess.run([sys.executable, paths.script("prepare", "scan.py"), "--split", args.split],
                   check=True)
    archs = (seq2seq_tiny_archs() if args.all else
             args.archs.split(",") if args.archs else DEFAULT_ARCHS)
    os.makedirs(args.out_dir, exist_ok=True)
    runs_todo = [(arch, seed) for arch in archs for seed in seeds]
    jobs = min(args.jobs, len(runs_todo))
    print(f"[2/4] {len(runs_todo)} run{'s' if len(runs_todo) > 1 else ''} ({', '.join(archs)}; "
          f"seed{'s' if len(seeds) > 1 else ''} {','.join(map(str, seeds))}), {jobs} at a time, "
          f"one CPU thread each: {args.max_update} updates (validation every "
          f"{args.validate_every}), then greedy generation on {args.gen_subset} ...", flush=True)
    # one thread per run: on CPU, parallel single-threaded runs train more updates per second
    # than one run on every core, and a run's numbers do not depend on the machine's core count
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    done = {}
    # while the runs train: updates done and the latest validation exact match of each (a line
    # that updates in a terminal, a plain line per validation in a log)
    progress = TrainingProgress(
        {f"{arch} seed {seed}": os.path.join(run_dir_of(args.out_dir, arch, seed), "train.log")
         for arch, seed in runs_todo}, args.max_update)
    try:
        with progress:
            for (arch, seed, *_), r in runs.in_parallel(
                    train_and_evaluate,
                    [(arch, seed, data, args.out_dir, args) for arch, seed in runs_todo], jobs):
                done[arch, seed] = r
                progress.done(f"{arch} seed {seed}")
                progress.print(
                    f"      ({len(done)}/{len(runs_todo)}) {r['arch']} seed {r['seed']}: exact "
                    f"match {r['exact_match']:.2f}% (validation at the end "
                    f"{r['final_valid_exact_match']:.1f}%; train {r['train_seconds']} s, "
                    f"generate {r['generate_seconds']} s)")
    except runs.StepError as e:
        raise SystemExit(f"quickstart: {e}") from None
    results = [done[key] for key in runs_todo]
    summary = summarise(results, archs)
    committed = committed_rows(args)
    analysis = None
    if not args.no_analysis:
        print("[3/4] what each model's layers hold (scripts/analyze_layers.py, "
              "docs/analysis.md) ...", flush=True)
        analysis_dir = os.path.join(args.out_dir, "analysis")
        first_seed = [r for r in results if r["seed"] == seeds[0]]
        checkpoints = [r["checkpoint"] for r in first_seed]
        try:
            runs.run_logged([sys.executable, paths.script("analyze_layers.py"), checkpoints[0],
                             *(["--compare", *checkpoints[1:]] if len(checkpoints) > 1 else []),
                             "--labels", ",".join(archs), "--data", data,
                             "--subset", args.gen_subset, "--max-sentences", "1000",
                             "--out-dir", analysis_dir],
                            os.path.join(args.out_dir, "analysis.log"))
        except runs.StepError as e:
            raise SystemExit(f"quickstart: {e}") from None
        with open(os.path.join(analysis_dir, "analysis.json")) as f:
            analysis = json.load(f)
    wall = time.time() - start
    table = markdown(results, summary, committed, args, wall)
    sentences = two_sentences(summary, analysis or {"analyses": {}}, committed).replace(
        "{split}", args.split)
    report = {"recipe": recipe(args), "seeds": seeds, "archs": archs, "summary": summary,
              "results": results, "wall_seconds": round(wall, 1), "what_it_shows": sentences,
              "package_version": runs.package_version()}
    json_path = os.path.join(args.out_dir, "results.json")
    md_path = os.path.join(args.out_dir, "results.md")
    with open(json_path, "w") as f:
        json.dump(report, f, indent=2)
    with open(md_path, "w") as f:
        f.write(table + "\n\n" + sentences + "\n")
    print("[4/4] results\n")
    print(table)
    print("\n" + sentences)
    print(f"\ntable: {md_path}\njson: {json_path}"
          + (f"\nlayer analysis: {os.path.join(args.out_dir, 'analysis', 'analysis.png')}"
             if analysis else "")
          + f"\nruns (checkpoints, logs, generations): {args.out_dir}/<arch>-seed<k>/"
          + f"\n{wall / 60:.1f} minutes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
