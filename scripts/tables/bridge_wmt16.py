#!/usr/bin/env python3
"""Table 3: the encoder-decoder FC bridge: the paper's four conditions from a pretrained model,
with equal batch size and step budget in every condition, plus the untouched model's BLEU.

    python scripts/tables/bridge_wmt16.py --scale {smoke,small,paper} [--from DIR] \\
        [--opus-mt HF_DIR] [--results-dir DIR]

Conditions (Song 2024, arXiv 2405.08570): (1) fine-tune with the bridge, original init; (2)
fine-tune without a bridge; (3) fine-tune with the bridge, GCA init; (4) retrain from scratch with
the bridge, GCA init. The paper's comparison was confounded (batch sizes differed between
conditions); here every condition gets the same sentences per update, the same optimiser and
schedule and the same number of updates. Fine-tuning goes through ``fairseq-train
--finetune-from-model`` (the bridge weights are created by ``--bridge-init``; with ``original`` the
model starts exactly as the pretrained one). BLEU: ``fairseq-generate`` (beam 4, SentencePiece
detokenised) and ``scripts/score_bleu.py`` (sacreBLEU 13a) on the test set. The bridge heatmaps of
conditions 1, 3 and 4 and the training curves are saved as PNGs.

Scales: ``paper`` = opus-mt-de-en converted from Marian (``--opus-mt HF_DIR``, a local copy of
Helsinki-NLP/opus-mt-de-en) fine-tuned on the first 1M WMT16 pairs (``--from DIR/wmt16``), one
epoch at 128 sentences per update (7,813 updates), Adam(W) lr 2e-5 decaying linearly, no warm-up,
weight decay 0.01, clipping 1.0, lengths <= 128, newstest2016; ``small`` = Multi30k De-En
(``--from DIR/multi30k``) with a 3+3-layer d=64 transformer pretrained here for 1,500 updates
standing in for opus-mt, then 600 updates per condition at lr 5e-4; ``smoke`` = the same with ten
pre-training and five fine-tuning updates.
"""
import os
import sys

from layerlab import paths, recipes, stats, tables

NAME = "bridge_wmt16"
ROWS = {
    "bridge_original": ("bridge", ["--bridge-init", "original"], True,
                        "(1) fine-tune, bridge, original init", 33.60),
    "plain": ("plain", [], True, "(2) fine-tune, no bridge", 36.43),
    "bridge_gca": ("bridge", ["--bridge-init", "gca"], True, "(3) fine-tune, bridge, GCA init",
                   32.15),
    "retrain_gca": ("bridge", ["--bridge-init", "gca"], False,
                    "(4) retrain from scratch, bridge, GCA init", 0.0),
}
UNTOUCHED_PUBLISHED = 40.20
SMALL_SIZE = ["--encoder-layers", "3", "--decoder-layers", "3"]
SCALES = {
    "smoke": dict(data="multi30k", archs={"plain": "transformer_tiny",
                                          "bridge": "bridge_transformer_tiny"},
                  size_flags=SMALL_SIZE,
                  pretrain=["--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "2048",
                            "--max-update", "10", "--log-interval", "5",
                            "--share-all-embeddings"],
                  finetune=["--optimizer", "adam", "--lr", "5e-4", "--batch-size", "32",
                            "--max-update", "5", "--log-interval", "5", "--clip-norm", "1.0",
                            "--share-all-embeddings"],
                  gen=["--beam", "1", "--max-len-a", "0", "--max-len-b", "4",
                       "--batch-size", "512"], seeds=(1,)),
    "small": dict(data="multi30k", archs={"plain": "transformer_tiny",
                                          "bridge": "bridge_transformer_tiny"},
                  size_flags=SMALL_SIZE,
                  pretrain=["--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "2e-3",
                            "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "300",
                            "--dropout", "0.1", "--max-tokens", "4096", "--max-update", "1500",
                            "--log-interval", "50", "--share-all-embeddings",
                            "--criterion", "label_smoothed_cross_entropy",
                            "--label-smoothing", "0.1"],
                  finetune=["--optimizer", "adam", "--adam-betas", "(0.9, 0.999)",
                            "--weight-decay", "0.01", "--lr", "5e-4",
                            "--lr-scheduler", "polynomial_decay", "--total-num-update", "600",
                            "--warmup-updates", "0", "--clip-norm", "1.0", "--batch-size", "128",
                            "--max-update", "600", "--log-interval", "50", "--dropout", "0.1",
                            "--share-all-embeddings", "--validate-interval-updates", "200"],
                  gen=["--beam", "4", "--max-len-a", "1.2", "--max-len-b", "10",
                       "--batch-size", "128"], seeds=(1,)),
    "paper": dict(data="wmt16", archs={"plain": "opus_mt_de_en",
                                       "bridge": "bridge_opus_mt_de_en"},
                  size_flags=[], pretrain=None,
                  finetune=["--optimizer", "adam", "--adam-betas", "(0.9, 0.999)",
                            "--weight-decay", "0.01", "--lr", "2e-5",
                            "--lr-scheduler", "polynomial_decay", "--total-num-update", "7813",
                            "--warmup-updates", "0", "--clip-norm", "1.0", "--batch-size", "128",
                            "--max-update", "7813", "--max-source-positions", "128",
                            "--max-target-positions", "128",
                            "--skip-invalid-size-inputs-valid-test",
                            "--log-interval", "100", "--fp16"],
                  gen=["--beam", "4", "--batch-size", "64", "--max-len-a", "1.5",
                       "--max-len-b", "10"], seeds=(1,)),
}
SUBSTITUTIONS = {
    "paper": ["equal budgets: every condition 128 sentences per update for 7,813 updates (one "
              "epoch of 1M pairs); the paper's batch sizes differed between conditions",
              "fairseq's Adam with decoupled weight decay 0.01 stands in for AdamW"],
    "small": ["Multi30k De-En (29k pairs, test_2016_flickr) instead of WMT16 (1M pairs, "
              "newstest2016)",
              "a 3+3-layer d=64 transformer pre-trained here for 1,500 updates on Multi30k "
              "stands in for opus-mt-de-en (the fine-tuning data is then not a new domain)",
              "600 updates of 128 sentences per condition at lr 5e-4 (linear decay), one seed",
              "published numbers are WMT16 newstest2016 BLEU of opus-mt: only the ordering of "
              "the conditions is comparable"],
    "smoke": ["ten pre-training and five fine-tuning updates, greedy outputs of at most 4 "
              "tokens: proves the pipeline, measures nothing"],
}


def prepare(table, cfg):
    if cfg["data"] == "multi30k":
        text, data = table.data("multi30k"), table.data_bin("multi30k")
        flags = ["--out-dir", text, "--dest-dir", data]
        table.prepare("multi30k.py", flags + (["--from", table.from_dir("multi30k")]
                                              if table.args.from_dir else []))
        return text, data, os.path.join(text, "spm.model"), os.path.join(text, "test.raw.en")
    if not table.args.opus_mt:
        raise tables.TableError("the paper scale fine-tunes opus-mt-de-en: give --opus-mt "
                                "HF_DIR (a local copy of Helsinki-NLP/opus-mt-de-en)")
    converted = table.data_bin("opus-mt-de-en")
    if table.args.dry_run or not os.path.exists(os.path.join(converted, "checkpoint.pt")):
        table.run([sys.executable, paths.script("convert_opus_mt.py"),
                   table.args.opus_mt, converted])
    text, data = table.data("wmt16-de-en-opus-mt"), table.data_bin("wmt16-de-en-opus-mt")
    flags = ["--opus-mt-dir", converted, "--out-dir", text, "--dest-dir", data]
    table.prepare("wmt16.py", flags + (["--from", table.from_dir("wmt16")]
                                       if table.args.from_dir else []))
    return text, data, os.path.join(converted, "target.spm"), os.path.join(text, "test.raw.en")


def pretrained(table, cfg, data):
    """The checkpoint every fine-tuning condition starts from (opus-mt converted, or trained
    here), resumable like the rows."""
    if cfg["pretrain"] is None:
        return os.path.join(table.data_bin("opus-mt-de-en"), "checkpoint.pt")
    run_dir = table.run_dir("pretrained", 1)
    path = os.path.join(run_dir, "checkpoint_best.pt")
    if not table.finished("pretrained", 1):
        table.train("pretrained", 1, data, ["--arch", cfg["archs"]["plain"], *cfg["size_flags"],
                                            "--task", "translation", "-s", "de", "-t", "en",
                                            "--no-epoch-checkpoints", *cfg["pretrain"]])
        table.save_result("pretrained", 1, {"checkpoint": path})
    return path


def bleu(table, run_dir, data, cfg, spm, ref, checkpoint="checkpoint_last.pt"):
    log = tables.generate(table, run_dir, data, "test",
                          [*cfg["gen"], "--bpe", "sentencepiece", "--sentencepiece-model", spm],
                          checkpoint=checkpoint)
    result = tables.score(table, "score_bleu.py", [log, "--ref", ref])
    return None if result is None else round(result["bleu"], 2)


def run_row(table, row, seed, cfg, data, spm, ref, start):
    done = table.finished(row, seed)
    if done:
        return done
    family, flags, finetune, _, _ = ROWS[row]
    extra = ["--finetune-from-model", start] if finetune else []
    run_dir = table.train(row, seed, data, ["--arch", cfg["archs"][family], *flags,
                                            *cfg["size_flags"], "--task", "translation",
                                            "-s", "de", "-t", "en", "--no-epoch-checkpoints",
                                            *extra, *cfg["finetune"]])
    score = bleu(table, run_dir, data, cfg, spm, ref)
    if table.args.dry_run:
        return None
    return table.save_result(row, seed, {"row": row, "seed": seed, "bleu": score})


def main(argv=None):
    parser = tables.table_parser(__doc__.split("\n\n")[0], NAME)
    parser.add_argument("--opus-mt", metavar="HF_DIR",
                        help="paper scale: a local Helsinki-NLP/opus-mt-de-en folder")
    args = parser.parse_args(argv)
    table = tables.Table(NAME, args, argv)
    cfg = SCALES[args.scale]
    text, data, spm, ref = prepare(table, cfg)
    start = pretrained(table, cfg, data)
    untouched = table.finished("untouched", 0)
    if not untouched:
        untouched_dir = table.run_dir("untouched", 0)
        if not args.dry_run:
            os.makedirs(untouched_dir, exist_ok=True)
        score = bleu(table, untouched_dir, data, cfg, spm, ref, checkpoint=start)
        untouched = table.save_result("untouched", 0, {"bleu": score})
    rows, seeds = table.rows(ROWS), table.seeds(cfg["seeds"])
    results = {row: [run_row(table, row, s, cfg, data, spm, ref, start) for s in seeds]
               for row in rows}
    if args.dry_run:
        return 0
    budget = recipes.flag_value(cfg["finetune"], "--max-update")
    lines = [f"BLEU (sacreBLEU 13a, detokenised, beam 4) on the test set, last checkpoint, seeds "
             f"{','.join(map(str, seeds))}; every condition {budget} updates of the same batch "
             "size and schedule. Published: the paper's WMT16 "
             "newstest2016 BLEU (its conditions had different batch sizes).", "",
             "| condition | BLEU | published |", "|---|---:|---:|",
             f"| untouched pretrained model | {untouched['bleu']:.2f} | "
             f"{UNTOUCHED_PUBLISHED:.2f} |"]
    summary = {}
    for row in rows:
        mean, std = stats.mean_std([r["bleu"] for r in results[row]])
        summary[row] = {"bleu": (mean, std), "published": ROWS[row][4], "runs": results[row]}
        lines.append(f"| {ROWS[row][3]} | {stats.fmt(mean, std)} | {ROWS[row][4]:.2f} |")
    curves = table.curves({ROWS[r][3]: table.run_dir(r, seeds[0]) for r in rows})
    heatmap = None
    bridged = [r for r in rows if ROWS[r][0] == "bridge"]
    if bridged:
        plot_bridge = paths.load_script("plot_bridge.py")

        heatmap = os.path.join(table.out_dir, "bridge_weights.png")
        plot_bridge.plot([(ROWS[r][3], *plot_bridge.bridge_norms(
            os.path.join(table.run_dir(r, seeds[0]), "checkpoint_last.pt"))) for r in bridged],
            heatmap)
    table.write(lines, {"title": "Encoder-decoder FC bridge: the four conditions, equal budgets",
                        "substitutions": SUBSTITUTIONS[args.scale], "config": cfg,
                        "untouched_bleu": untouched["bleu"],
                        "published": {"untouched": UNTOUCHED_PUBLISHED,
                                      **{r: ROWS[r][4] for r in ROWS}},
                        "rows": summary}, [curves, heatmap])
    return 0


if __name__ == "__main__":
    sys.exit(tables.run_main(main, NAME))
