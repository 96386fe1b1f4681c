#!/usr/bin/env python3
"""Table 4: the autoregressive encoder-decoder LM's reference table (eight rows), train and
validation cross-entropy in nats and parameter counts, next to the published numbers.

    python scripts/tables/lm_table.py --scale {smoke,small,paper} [--from DIR] [--results-dir DIR]

Rows (the reference table of yif-AI's autoregressive_encoder_decoder_transformer): embedding loss
cosine / MSE, plain encoder-decoder, positional-embedding subtraction, MSE x8 + subtraction
(``ar_encdec_lm``); baseline, smaller baseline, dropout-0.2 baseline (``gpt_baseline_lm``). Each
row is trained with ``fairseq-train --user-dir`` on the ``language_modeling`` task and its last
checkpoint is scored on the validation set with ``fairseq-eval-lm``; the training cross-entropy is
the last logged ``nll_loss`` (the embedding loss excluded) / ``loss``, converted from fairseq's
bits to nats. Parameter counts are the reference's (tied embedding once, positional table
excluded), as logged at build time.

Scales: ``paper`` = the reference recipe (context 200, batch 50 x 16, AdamW-style Adam lr 9e-4
constant after 300 warm-up updates, betas 0.9/0.95, weight decay 0.1, bf16, 9,000 updates) on
WikiText-103 with a 50k SentencePiece vocabulary standing in for the reference's Wikipedia text
with GPT-2 BPE; ``small`` = WikiText-2, 8k vocabulary, models of ~0.9M parameters with the
reference's proportions, context 128, 800 updates, one seed (the reference table has one run per
row); ``smoke`` = the first 4,000 lines of WikiText-2 with a 1k vocabulary and ten updates per row.
"""
import os
import re
import sys

from layerlab import fairseq_log, paths, stats, tables

NAME = "lm_table"
EMB = ["--criterion", "lm_embedding_loss", "--embedding-loss"]
# row -> (model family, flags); published (train, valid) cross-entropy in nats (the reference)
ROWS = {
    "emb_cosine": ("ar", EMB + ["cosine"], (2.993, 3.387), "embedding loss, cosine"),
    "emb_mse": ("ar", EMB + ["mse"], (2.998, 3.385), "embedding loss, MSE"),
    "encdec": ("ar", [], (3.043, 3.413), "plain encoder-decoder"),
    "pos_sub": ("ar", ["--pos-embed-subtraction", "yes_no_ln"], (2.979, 3.381),
                "positional-embedding subtraction"),
    "emb_mse8_pos_sub": ("ar", EMB + ["mse", "--embedding-loss-coeff", "8",
                                      "--pos-embed-subtraction", "yes_no_ln"], (2.982, 3.378),
                         "MSE (x8) + subtraction"),
    "baseline": ("gpt", [], (2.937, 3.424), "baseline"),
    "baseline_small": ("gpt_small", [], (2.958, 3.416), "smaller baseline"),
    "baseline_dropout": ("gpt", ["--dropout", "0.2"], (3.174, 3.406), "dropout-0.2 baseline"),
}
PUBLISHED_PARAMS = {"ar_emb": 15_763_500, "ar": 15_762_900, "gpt": 16_036_800,
                    "gpt_small": 15_441_192}

# model sizes per scale: the paper's presets; below it, the reference's proportions shrunk
# (AR: d, L + L, 4 / 8 heads; baseline: a slightly wider d and 2L layers; smaller baseline
# in between), so that the AR model's parameter count sits between the two baselines' again
SMALL_SIZES = {
    "ar": ["--arch", "ar_encdec_lm", "--embed-dim", "64", "--layers", "3",
           "--attention-heads", "4", "--cross-attention-heads", "8"],
    "gpt": ["--arch", "gpt_baseline_lm", "--embed-dim", "68", "--layers", "6",
            "--attention-heads", "4"],
    "gpt_small": ["--arch", "gpt_baseline_lm", "--embed-dim", "66", "--layers", "6",
                  "--attention-heads", "6"],
}
PAPER_SIZES = {"ar": ["--arch", "ar_encdec_lm_yif"], "gpt": ["--arch", "gpt_baseline_lm_yif"],
               "gpt_small": ["--arch", "gpt_baseline_lm_yif_small"]}
SCALES = {
    "smoke": dict(dataset="wikitext-2", head_lines=4000, vocab=1000, sizes=SMALL_SIZES,
                  context=32, batch=4, update_freq=1, lr=2e-3, warmup=2, updates=10, log_interval=5,
                  validate_every=10, seeds=(1,), precision=[]),
    "small": dict(dataset="wikitext-2", vocab=8000, sizes=SMALL_SIZES, context=128, batch=16,
                  update_freq=1, lr=2e-3, warmup=100, updates=800, log_interval=50,
                  validate_every=200, seeds=(1,), precision=[]),
    "paper": dict(dataset="wikitext-103", vocab=50000, sizes=PAPER_SIZES, context=200, batch=50,
                  update_freq=16, lr=9e-4, warmup=300, updates=9000, log_interval=50,
                  validate_every=500, seeds=(1,), precision=["--bf16"]),
}
SUBSTITUTIONS = {
    "paper": ["WikiText-103 with a 50k SentencePiece vocabulary instead of the reference's ~179 MB "
              "Wikipedia text with GPT-2 BPE (50,257): parameter counts differ by the "
              "vocabulary term only",
              "fairseq's Adam with --weight-decay 0.1 decays every tensor; the reference decays "
              "only tensors with >= 2 dimensions"],
    "small": ["WikiText-2 (2M tokens) with an 8k SentencePiece vocabulary instead of ~179 MB of "
              "Wikipedia with GPT-2 BPE",
              "models of ~0.9M parameters (AR: d=64, 3+3 blocks, 4/8 heads; baseline d=68, 6 "
              "blocks, 4 heads; smaller baseline d=66, 6 blocks, 6 heads) instead of ~16M",
              "context 128, 16 sequences per update, 800 updates, lr 2e-3 (the reference: context "
              "200, 800 sequences per update, 9,000 updates, lr 9e-4)",
              "fairseq's Adam with --weight-decay 0.1 decays every tensor; the reference decays "
              "only tensors with >= 2 dimensions"],
    "smoke": ["the first 4,000 lines of WikiText-2's training text, 1k vocabulary, ten updates: "
              "proves the pipeline, measures nothing"],
}


def prepare(table, cfg):
    """The LM data-bin; the smoke scale takes the first ``head_lines`` lines of the training
    text (split 98/1/1 by prepare/lm.py --text) so that every step is quick."""
    if cfg.get("head_lines"):
        name = f"{cfg['dataset']}-head{cfg['head_lines']}-v{cfg['vocab']}"
        release = table.from_dir(cfg["dataset"])
        if release is None:
            raise tables.TableError(f"the smoke scale reads a local {cfg['dataset']} copy: "
                             f"give --from DIR with DIR/{cfg['dataset']}/train.txt")
        text = os.path.join(release, "train.txt")
        if not table.args.dry_run and not os.path.isfile(text):
            raise tables.TableError(f"{text}: no such file")
        head = os.path.join(table.data_root, "data", f"{name}.txt")
        if table.args.dry_run or not os.path.exists(head):
            table.cut_lines(text, head, cfg["head_lines"])
        flags = ["--text", head]
    else:
        name = f"{cfg['dataset']}-v{cfg['vocab']}"
        flags = ["--dataset", cfg["dataset"]]
        if table.args.from_dir:
            flags += ["--from", table.from_dir(cfg["dataset"])]
    flags += ["--vocab-size", cfg["vocab"], "--name", name, "--out-dir", table.data(name),
              "--dest-dir", table.data_bin(name)]
    table.prepare("lm.py", [str(f) for f in flags])
    return table.data_bin(name)


def train_flags(row, cfg):
    family, extra, _, _ = ROWS[row]
    criterion = [] if "--criterion" in extra else ["--criterion", "cross_entropy"]
    return [*cfg["sizes"][family], *extra, *criterion, "--task", "language_modeling",
            "--tokens-per-sample", cfg["context"], "--sample-break-mode", "none",
            "--optimizer", "adam", "--adam-betas", "(0.9, 0.95)", "--weight-decay", "0.1",
            "--lr", cfg["lr"], "--lr-scheduler", "fixed", "--warmup-updates", cfg["warmup"],
            "--batch-size", cfg["batch"], "--update-freq", cfg["update_freq"],
            "--max-update", cfg["updates"], "--log-interval", cfg["log_interval"],
            "--validate-interval-updates", cfg["validate_every"], "--no-epoch-checkpoints",
            "--required-batch-size-multiple", "1", *cfg["precision"]]


EVAL_LOSS = re.compile(r"Loss \(base 2\): ([0-9.]+)")
PARAMS = re.compile(r"([0-9,]+) parameters as the reference counts them")


def run_row(table, row, seed, data, cfg):
    done = table.finished(row, seed)
    if done:
        return done
    run_dir = table.train(row, seed, data, train_flags(row, cfg))
    eval_log = os.path.join(run_dir, "eval_lm.log")
    table.run([*paths.fairseq_command("fairseq-eval-lm"), data, "--user-dir", paths.PLUGIN_DIR,
               "--path", os.path.join(run_dir, "checkpoint_last.pt"), "--gen-subset", "valid",
               "--tokens-per-sample", cfg["context"], "--batch-size", "8", "--num-workers", "0"],
              eval_log)
    if table.args.dry_run:
        return None
    train_log = os.path.join(run_dir, "train.log")
    record = fairseq_log.last_record(train_log, "train_inner") or {}
    train_bits = float(record.get("nll_loss", record.get("loss", "nan")))
    valid_bits = float(EVAL_LOSS.findall(open(eval_log).read())[-1])
    params = PARAMS.findall(open(train_log).read())
    return table.save_result(row, seed, {
        "row": row, "seed": seed, "train_nats": round(fairseq_log.bits_to_nats(train_bits), 4),
        "valid_nats": round(fairseq_log.bits_to_nats(valid_bits), 4),
        "params_reference_count": int(params[0].replace(",", "")) if params else None})


def main(argv=None):
    args = tables.table_parser(__doc__.split("\n\n")[0], NAME).parse_args(argv)
    table = tables.Table(NAME, args, argv)
    cfg = SCALES[args.scale]
    data = prepare(table, cfg)
    rows, seeds = table.rows(ROWS), table.seeds(cfg["seeds"])
    results = {row: [run_row(table, row, s, data, cfg) for s in seeds] for row in rows}
    if args.dry_run:
        return 0
    lines = ["Cross-entropy in nats per token (fairseq logs bits: converted); train = the last "
             f"logged training loss (embedding loss excluded), valid = `fairseq-eval-lm` on the "
             f"validation set, last checkpoint; seeds {','.join(map(str, seeds))} (mean ± sample "
             "std when more than one).", "",
             "| row | model | flags | train (published) | valid (published) | params "
             "(published, V = 50,257) |", "|---|---|---|---:|---:|---:|"]
    summary = {}
    for row in rows:
        family, extra, (p_train, p_valid), label = ROWS[row]
        train = stats.mean_std([r["train_nats"] for r in results[row]])
        valid = stats.mean_std([r["valid_nats"] for r in results[row]])
        params = results[row][0]["params_reference_count"]
        published = PUBLISHED_PARAMS["ar_emb" if family == "ar" and "--embedding-loss" in extra
                                     else family]
        summary[row] = {"label": label, "train_nats": train, "valid_nats": valid,
                        "params": params, "published": {"train_nats": p_train,
                                                        "valid_nats": p_valid,
                                                        "params": published},
                        "runs": results[row]}
        model = " ".join(cfg["sizes"][family])
        flags = f"`{' '.join(extra)}`" if extra else "(none)"
        lines.append(f"| {label} | `{model}` | {flags} | {stats.fmt(*train, digits=3)} "
                     f"({p_train:.3f}) | {stats.fmt(*valid, digits=3)} ({p_valid:.3f}) | "
                     f"{f'{params:,}' if params else 'n/a'} ({published:,}) |")
    curves = table.curves({r: table.run_dir(r, seeds[0]) for r in rows}, "curves.png", nats=True,
                          title=f"LM table ({args.scale}): cross-entropy (embedding loss "
                                "excluded), nats")
    table.write(lines, {"title": "Autoregressive encoder-decoder LM: the reference table",
                        "substitutions": SUBSTITUTIONS[args.scale], "config": cfg | {
                            "sizes": {k: " ".join(v) for k, v in cfg["sizes"].items()}},
                        "rows": summary}, [curves])
    return 0


if __name__ == "__main__":
    sys.exit(tables.run_main(main, NAME))
