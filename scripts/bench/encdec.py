#!/usr/bin/env python3
"""Speed and memory of the encoder-decoder comparison's rows against its baseline, at the size
that comparison trains them (JSON + markdown).

    python scripts/bench/encdec.py --task multi30k [--recipe NAME] [--rows baseline,mudd,...]
        [--data DIR] [--generate] [--quick] [--device cuda --fp16]
        [--out results/bench_encdec_multi30k_cpu.json] [--markdown ...]

The models are scripts/experiments/encdec_comparison.py's: every row the task runs under its
chosen recipe (or ``--recipe``), with its matched wider-FFN baselines, each built with the
recipe's model flags (sizes, pre-norm, dropout, shared embeddings) over the task's own
dictionaries (``--data``, by default the prepared data-bin folder). A batch is as fairseq's
``--max-tokens`` of the recipe makes it, of sentences at the training set's mean source and
target lengths (synthetic tokens of the real vocabularies). Measured as scripts/bench/seq2seq.py
measures (its worker): each row and the baseline trained in one process in alternating windows,
the time ratio the median of the per-window ratios; the peak memory growth of training in a
process per model; with ``--generate`` also beam-5 generation. The encoder-decoder comparison's
report takes each row's time and memory ratios from this file (results/bench_encdec_<task>_cpu.json)
when its recipe is the report's. Ratios are the result; absolute numbers only mean something on
a GPU.
"""
import argparse
import os
import sys

import torch

from layerlab import bench as common
from layerlab import paths, recipes, runner

seq2seq = paths.load_script("bench", "seq2seq.py")  # the worker: a model's batch and timings


def comparison():
    """The encoder-decoder comparison's declaration (its rows, recipes and tasks)."""
    return paths.load_script("experiments", "encdec_comparison.py")


def mean_lengths(data, languages):
    """(source, target) mean sentence lengths in tokens (EOS included) of ``data``'s training
    set, rounded."""
    from fairseq.data import Dictionary, data_utils

    source, target = languages
    out = []
    for lang in languages:
        dataset = data_utils.load_indexed_dataset(
            os.path.join(data, f"train.{source}-{target}.{lang}"),
            Dictionary.load(os.path.join(data, f"dict.{lang}.txt")))
        if dataset is None:
            raise runner.PlanError(f"{data}: no training set train.{source}-{target}.{lang}")
        out.append(max(2, round(float(dataset.sizes.mean()))))
    return tuple(out)


def plan(args):
    """(models {name: (architecture, flags)}, cfg, dictionary paths, recipe name, {row: its
    matched baseline}) for ``args``: the task's rows under its recipe with their matched
    baselines; one line (PlanError) for what cannot be measured."""
    cmp = comparison()
    task = args.task
    if task not in cmp.TASKS:
        raise runner.PlanError(f"unknown task {task!r}; known: {', '.join(cmp.TASKS)}")
    name = args.recipe or cmp.CHOSEN[task]
    if name is None:
        raise runner.PlanError(f"{task}: no recipe chosen yet (encdec_comparison.CHOSEN); "
                               "give --recipe")
    task_rows = cmp.TASK_ROWS[task] if name == cmp.CHOSEN[task] else None
    rows = args.rows or [r for r in cmp.ROWS if task_rows is None or r in task_rows]
    chosen = cmp.choose(argparse.Namespace(tasks=[task], rows=rows, recipe={task: name},
                                           data={task: args.data} if args.data else {}))
    data = chosen[task][1]
    declared = runner.Comparison("encdec_bench", [cmp.row_of(r) for r in rows], [task], [1],
                                 cmp.BASELINE)
    declared.check(lambda row, t: cmp.build_model(t, name, row, data))
    matched = cmp.add_matched_baselines(declared, chosen)
    models = {row.name: (row.arch, cmp.model_flags(task, name, row)) for row in declared.rows}
    flags = cmp.RECIPES[task][name]
    src_len, tgt_len = mean_lengths(data, cmp.TASKS[task].languages)
    cfg = dict(layers=int(recipes.flag_value(flags, "--encoder-layers")),
               d=int(recipes.flag_value(flags, "--encoder-embed-dim")),
               ffn=int(recipes.flag_value(flags, "--encoder-ffn-embed-dim")),
               heads=int(recipes.flag_value(flags, "--encoder-attention-heads")),
               max_tokens=int(recipes.flag_value(flags, "--max-tokens")), src_len=src_len,
               tgt_len=tgt_len, gen_sentences=8 if args.quick else 64)
    dictionaries = [os.path.abspath(os.path.join(data, f"dict.{lang}.txt"))
                    for lang in cmp.TASKS[task].languages]
    return models, cfg, dictionaries, name, matched.get(task, {})


def run(args):
    """The report (a dict) for parsed options."""
    models, cfg, dictionaries, recipe, matched = plan(args)
    base = comparison().BASELINE
    if args.quick:
        windows = dict(train=2, steps=1, warmup=1, gen=1 if args.generate else 0)
    else:
        windows = dict(train=7, steps=3, warmup=3, gen=7 if args.generate else 0)
    job = dict(cfg=cfg, device=args.device, fp16=args.fp16, threads=args.threads,
               windows=windows, models=models, dictionaries=dictionaries)
    results, pairs = seq2seq.measure_against(os.path.abspath(__file__), job, base,
                                             [n for n in models if n != base], args.threads,
                                             together=args.quick)
    ratios = {}
    base_memory = results[base]["train_peak_memory_growth_mb"]
    for name, pair in pairs.items():
        ratios[name] = {
            "train_time_ratio": common.paired_ratio(pair[name], pair[base]),
            # a CPU peak can grow by 0 MB in a quick run's shared process: no ratio then
            "memory_growth_ratio": (round(results[name]["train_peak_memory_growth_mb"]
                                          / base_memory, 3) if base_memory > 0 else None),
            "params_extra": results[name]["params"] - results[base]["params"]}
        if windows["gen"]:
            ratios[name]["generate_speed_ratio"] = round(1 / common.paired_ratio(
                pair[name], pair[base], "generate_seconds_per_round"), 3)
    return {"benchmark": "encdec", "task": args.task, "recipe": recipe, "device": args.device,
            "fp16": args.fp16, "threads": args.threads, "torch": torch.__version__,
            "quick": args.quick, "config": cfg, "windows": windows,
            "models": {n: list(m) for n, m in models.items()}, "matched": matched,
            "results": results, "ratios_vs_baseline": ratios}


def markdown_table(report):
    c, w = report["config"], report["windows"]
    gen = w["gen"] > 0
    lines = [f"{report['device']}{' fp16' if report['fp16'] else ''}, {report['threads']} "
             f"threads, torch {report['torch']}: the {report['task']} recipe "
             f"{report['recipe']} ({c['layers']}+{c['layers']} pre-norm layers, d={c['d']}, FFN "
             f"{c['ffn']}, {c['heads']} heads), {c['max_tokens']} tokens per batch of sentences "
             f"at the training set's mean lengths ({c['src_len']} / {c['tgt_len']}); training: "
             f"median over {w['train']} windows of {w['steps']} updates of the per-window ratio"
             + (f"; generation: beam 5, {c['gen_sentences']} sentences" if gen else "")
             + ". Ratios to the comparison's baseline (fairseq's `transformer`) in the same "
             "process; memory: peak growth of training, a process per model.", "",
             "| row | extra params | training time ratio | training peak-memory growth ratio |"
             + (" generation speed ratio |" if gen else ""),
             "|---|---:|---:|---:|" + ("---:|" if gen else "")]
    for name, r in report["ratios_vs_baseline"].items():
        memory = r["memory_growth_ratio"]
        lines.append(f"| {name} | {r['params_extra']:+,} | {r['train_time_ratio']:.3f} | "
                     + (f"{memory:.3f}" if memory is not None else "—") + " |"
                     + (f" {r['generate_speed_ratio']:.3f} |" if gen else ""))
    return "\n".join(lines)


def parser():
    p = common.bench_parser(__doc__.split("\n\n")[0])
    p.add_argument("--task", default="multi30k")
    p.add_argument("--recipe", help="a recipe of the comparison's RECIPES (default: the chosen)")
    p.add_argument("--rows", type=lambda t: t.split(","),
                   help="comma-separated rows (default: every row the task runs)")
    p.add_argument("--data", help="the task's data folder (default: the comparison's)")
    p.add_argument("--generate", action="store_true", help="also time beam-5 generation")
    p.add_argument("--markdown", help="also write a markdown table of the ratios here")
    return p


def main(argv=None):
    p = parser()

    def guarded(args):
        try:
            return run(args)
        except runner.PlanError as error:
            p.error(str(error))

    def write_markdown(report, args):
        if args.markdown:
            common.write_text(args.markdown, markdown_table(report))

    return common.bench_main(p, seq2seq.worker, guarded, argv, write_markdown)


if __name__ == "__main__":
    sys.exit(main())
