#!/usr/bin/env python3
"""Table 2: layer-wise fusion (LRF) on CFQ: Transformer vs encoder + decoder fusion, exact match
per MCD split and their mean, over seeds (mean ± spread).

    python scripts/tables/lrf_cfq.py --scale {smoke,small,paper} [--from DIR] [--results-dir DIR]

Data: ``scripts/prepare/cfq.py`` (the release under ``--from DIR/cfq``; at the small and smoke
scales Google's preprocessed MCD1 files under ``--from DIR/cfq_mcd1``, of which a subset is
taken). Each row is trained with ``fairseq-train --user-dir``; the best checkpoint (validation
loss) translates the test set with beam 5 and ``scripts/score_exact_match.py`` scores it. The
first seed's curves and the fusion model's fuse-attention heatmap are saved as PNGs.

The LRF paper (Zheng et al. 2023, arXiv 2307.10799) gives no CFQ training recipe: the paper scale
uses the CoGnition recipe (transformer_iwslt_de_en sizes, Adam lr 5e-4, inverse-sqrt with 4,000
warm-up updates, dropout 0.3, label smoothing 0.1) for 50k updates of 8,192 tokens on MCD1, MCD2
and MCD3, 3 seeds.
"""
import os
import sys

from layerlab import paths, stats, tables

NAME = "lrf_cfq"
ROWS = {"transformer": "Transformer", "fusion": "LRF, encoder + decoder"}
SCALES = {
    "smoke": dict(splits=("mcd1",), subset=(2000, 100, 100), size="_tiny",
                  size_flags=["--encoder-layers", "2", "--decoder-layers", "2"],
                  recipe=["--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "4096",
                          "--max-update", "10", "--log-interval", "5"],
                  gen=["--beam", "1", "--max-len-a", "0", "--max-len-b", "4",
                       "--batch-size", "512"], seeds=(1,)),
    "small": dict(splits=("mcd1",), subset=(20000, 500, 1000), size="_tiny",
                  size_flags=["--encoder-layers", "3", "--decoder-layers", "3"],
                  recipe=["--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "2e-3",
                          "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "300",
                          "--dropout", "0.1", "--criterion", "label_smoothed_cross_entropy",
                          "--label-smoothing", "0.1", "--max-tokens", "8192",
                          "--max-update", "1200", "--log-interval", "50",
                          "--validate-interval-updates", "400"],
                  gen=["--beam", "5", "--max-len-a", "0", "--max-len-b", "256",
                       "--batch-size", "128"], seeds=(1, 2)),
    "paper": dict(splits=("mcd1", "mcd2", "mcd3"), subset=None, size="_iwslt_de_en",
                  size_flags=[],
                  recipe=["--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4",
                          "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4000",
                          "--dropout", "0.3", "--weight-decay", "0.0001",
                          "--criterion", "label_smoothed_cross_entropy",
                          "--label-smoothing", "0.1", "--max-tokens", "4096",
                          "--update-freq", "2", "--max-update", "50000", "--log-interval", "100",
                          "--fp16"],
                  gen=["--beam", "5", "--max-len-a", "0", "--max-len-b", "256",
                       "--batch-size", "128"], seeds=(1, 2, 3)),
}
SUBSTITUTIONS = {
    "paper": ["the LRF paper gives no CFQ recipe: the CoGnition recipe is used, 50k updates",
              "checkpoint selection by validation loss"],
    "small": ["MCD1 only (the preprocessed copy available offline has MCD1 train and dev only)",
              "the first 20,000 of 95,743 training pairs; valid = the first 500 dev lines; "
              "test = the next 1,000 dev lines (dev and test are drawn alike, compound-divergent "
              "from train)",
              "3+3-layer d=64 models (transformer_tiny sizes), 1,200 updates of 8,192 tokens, "
              "lr 2e-3, 2 seeds"],
    "smoke": ["2,000 training pairs, ten updates, greedy outputs of at most 4 tokens: proves the "
              "pipeline, measures nothing"],
}


def subset_source(table, counts):
    """Google's preprocessed MCD1 files cut to (train, valid, test) lines: a folder that
    cfq.py --preprocessed-from reads (dev -> valid; test = the dev lines after them)."""
    n_train, n_valid, n_test = counts
    src = table.from_dir("cfq_mcd1")
    if src is None:
        raise tables.TableError(f"the {table.scale} scale takes Google's preprocessed MCD1 files "
                         "(train_/dev_ encode/decode .txt): give --from DIR with DIR/cfq_mcd1")
    missing = [name for name in ("train_encode.txt", "train_decode.txt", "dev_encode.txt",
                                 "dev_decode.txt") if not os.path.isfile(os.path.join(src, name))]
    if missing and not table.args.dry_run:
        raise tables.TableError(f"{os.path.join(src, missing[0])}: no such file (the preprocessed "
                                "MCD1 files: train_/dev_ encode/decode .txt)")
    out = table.data(f"cfq-mcd1-{n_train}-source")
    for side in ("encode", "decode"):
        for src_name, dst_name, count, skip in ((f"train_{side}.txt", f"train_{side}.txt",
                                                 n_train, 0),
                                                (f"dev_{side}.txt", f"dev_{side}.txt", n_valid, 0),
                                                (f"dev_{side}.txt", f"test_{side}.txt", n_test,
                                                 n_valid)):
            dst = os.path.join(out, dst_name)
            if table.args.dry_run or not os.path.exists(dst):  # each cut is written atomically
                table.cut_lines(os.path.join(src, src_name), dst, count, skip)
    return out


def prepare(table, cfg, split):
    if cfg["subset"]:
        name = f"cfq-{split}-{cfg['subset'][0]}"
        flags = ["--split", split, "--preprocessed-from", subset_source(table, cfg["subset"]),
                 "--no-check-sizes"]
    else:
        name = f"cfq-{split}"
        flags = ["--split", split] + (["--from", table.from_dir("cfq")] if table.args.from_dir
                                      else [])
    table.prepare("cfq.py", flags + ["--out-dir", table.data(name),
                                     "--dest-dir", table.data_bin(name)])
    return table.data_bin(name)


def arch_flags(row, cfg):
    if row == "transformer":
        return ["--arch", f"transformer{cfg['size']}", "--share-decoder-input-output-embed"]
    return ["--arch", f"fusion_transformer{cfg['size']}"]


def run_row(table, row, split, seed, cfg, data):
    key = f"{row}-{split}"
    done = table.finished(key, seed)
    if done:
        return done
    run_dir = table.train(key, seed, data, [*arch_flags(row, cfg), *cfg["size_flags"],
                                            "--task", "translation", "-s", "in", "-t", "out",
                                            "--no-epoch-checkpoints", *cfg["recipe"]])
    log = tables.generate(table, run_dir, data, "test", cfg["gen"])
    em = tables.score(table, "score_exact_match.py", [log])
    if table.args.dry_run:
        return None
    return table.save_result(key, seed, {"row": row, "split": split, "seed": seed,
                                         "exact_match": round(em["exact_match"], 2)})


def main(argv=None):
    args = tables.table_parser(__doc__.split("\n\n")[0], NAME).parse_args(argv)
    table = tables.Table(NAME, args, argv)
    cfg = SCALES[args.scale]
    rows, seeds, splits = table.rows(ROWS), table.seeds(cfg["seeds"]), cfg["splits"]
    results = {}
    for split in splits:
        data = prepare(table, cfg, split)
        for row in rows:
            results[(row, split)] = [run_row(table, row, split, s, cfg, data) for s in seeds]
    if args.dry_run:
        return 0
    lines = [f"Exact match (%) on the test set, best checkpoint, beam 5 (smoke: greedy), seeds "
             f"{','.join(map(str, seeds))}: mean ± sample std; the mean column averages the "
             "splits' means. The LRF paper reports CFQ as exact match (no baseline numbers are "
             "given by the paper, so none are printed here).", "",
             "| row | " + " | ".join(s.upper() for s in splits) + " | mean |",
             "|---|" + "---:|" * (len(splits) + 1)]
    summary = {}
    for row in rows:
        per = {s: stats.mean_std([r["exact_match"] for r in results[(row, s)]]) for s in splits}
        mean = sum(m for m, _ in per.values()) / len(per)
        summary[row] = {"per_split": per, "mean": mean,
                        "runs": {s: results[(row, s)] for s in splits}}
        lines.append(f"| {ROWS[row]} | " + " | ".join(stats.fmt(*per[s]) for s in splits)
                     + f" | {mean:.2f} |")
    curves = table.curves({f"{ROWS[r]} ({splits[0]})": table.run_dir(f"{r}-{splits[0]}",
                                                                      seeds[0]) for r in rows})
    heatmap = weights = None
    if "fusion" in rows:
        plot_fusion = paths.load_script("plot_fusion.py")

        heatmap = os.path.join(table.out_dir, "fusion_weights.png")
        weights = plot_fusion.mean_weights(
            os.path.join(table.run_dir(f"fusion-{splits[0]}", seeds[0]), "checkpoint_best.pt"),
            prepare(table, cfg, splits[0]), "valid")
        plot_fusion.plot(weights, heatmap, f"LRF on CFQ {splits[0]}, seed {seeds[0]}")
    table.write(lines, {"title": "Layer-wise fusion (LRF) on CFQ",
                        "substitutions": SUBSTITUTIONS[args.scale], "config": cfg,
                        "rows": summary, "fusion_weights": weights}, [curves, heatmap])
    return 0


if __name__ == "__main__":
    sys.exit(tables.run_main(main, NAME))
