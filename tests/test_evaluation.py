"""Exact match and BLEU scorers, and the seq2seq_eval task's validation metrics."""
import json
import os

import pytest
import torch
from conftest import run_cli, run_script, train
from helpers import PLUGIN_DIR, SCRIPTS, parse_args

from fairseq import metrics
from fairseq.data import Dictionary
from fairseq_plugins.metrics.bleu import corpus_bleu
from fairseq_plugins.metrics.exact_match import exact_match


def test_exact_match_overall_and_per_category():
    r = exact_match(["a b", "c  d", "e", "f"], ["a b", "c d", "x", "f"],
                    categories=["in", "gen", "gen", "in"])
    assert (r["correct"], r["total"], r["exact_match"]) == (3, 4, 75.0)
    assert r["per_category"]["gen"] == {"exact_match": 50.0, "correct": 1, "total": 2}
    assert r["per_category"]["in"]["exact_match"] == 100.0
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        exact_match(["a", "b"], ["a"])


def _script(name, *args):
    return run_script(os.path.join(SCRIPTS, name), *args)


def test_score_exact_match_cli(tmp_path):
    log = tmp_path / "gen.txt"
    log.write_text("H-1\t-0.1\tI_WALK\nT-1\tI_WALK\nH-0\t-0.3\tI_RUN\nT-0\tI_JUMP\n"
                   "H-2\t-0.2\tI_LOOK\nT-2\tI_LOOK\n")
    cats = tmp_path / "cats"
    cats.write_text("a\nb\nb\n")
    proc = _script("score_exact_match.py", log, "--categories", cats, "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["correct"] == 2 and r["per_category"]["a"]["correct"] == 0
    ref = tmp_path / "ref"
    ref.write_text("I_RUN\nI_WALK\nI_LOOK\nI_TURN_LEFT\n")
    proc = _script("score_exact_match.py", log, "--ref", ref)
    assert proc.returncode == 2 and "first missing: 3" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0


def test_cognition_chinese_bleu_recipe():
    refs = ["泰勒在乡下有一所小房子。", "她不得不去买更多的东西。"]
    hyps = ["泰勒 在 乡下 有 一@@ 所 小 房子 。", "她 不得不 去 买 更 多 的 东西 。"]
    r = corpus_bleu(hyps, refs, cognition_zh=True)
    assert r["bleu"] == pytest.approx(100.0) and "tok:zh" in r["signature"]
    # without the recipe the segmented hypothesis does not match the raw reference
    assert corpus_bleu(hyps, refs)["bleu"] < 50


def test_score_bleu_cli(tmp_path):
    ref = tmp_path / "ref.en"
    ref.write_text("the cat sat on the mat .\nhello world\n")
    hyp = tmp_path / "gen.txt"
    hyp.write_text("D-1\t-0.1\thello world\nD-0\t-0.2\tthe cat sat on the mat .\n")
    proc = _script("score_bleu.py", hyp, "--ref", ref, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["bleu"] == pytest.approx(100.0)
    short = tmp_path / "short.txt"
    short.write_text("hello world\n")
    proc = _script("score_bleu.py", short, "--ref", ref)
    assert proc.returncode == 2 and "short.txt: 1 hypothesis lines, but" in proc.stderr


def test_score_exact_match_reads_a_plain_hypothesis_file(tmp_path):
    ref = tmp_path / "valid.out"
    ref.write_text("I_RUN\nI_WALK\nI_LOOK\n")
    hyps = tmp_path / "hyps.txt"
    hyps.write_text("I_RUN\nI_JUMP\nI_LOOK\n")
    proc = _script("score_exact_match.py", hyps, "--ref", ref, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["correct"] == 2
    # a plain file needs references: one line, exit 2
    proc = _script("score_exact_match.py", hyps)
    assert proc.returncode == 2 and "plain hypothesis file" in proc.stderr and "--ref" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0


@pytest.mark.parametrize("script", ["score_exact_match.py", "score_bleu.py"])
def test_plain_lines_that_start_like_log_lines_are_plain_unless_told(tmp_path, script):
    ref = tmp_path / "ref"
    lines = "H-1\tjump twice and walk left\nH-0\twalk around right after look\n"
    ref.write_text(lines)
    hyps = tmp_path / "hyps.txt"  # the hypotheses themselves start with "H-<n>\t"
    hyps.write_text(lines)
    key = "correct" if script == "score_exact_match.py" else "bleu"
    proc = _script(script, hyps, "--ref", ref, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[key] == (2 if key == "correct" else pytest.approx(100.0))
    # --format log forces the log reading: no scored hypothesis lines, a one-line error
    proc = _script(script, hyps, "--ref", ref, "--format", "log")
    assert proc.returncode == 2 and "no H-/D- hypothesis lines" in proc.stderr
    # and a real log is still read as one in the auto mode, --format plain overrides it
    log = tmp_path / "gen.txt"
    log.write_text("S-1\tx\nH-1\t-0.2\tH-0\twalk around right after look\nS-0\ty\n"
                   "H-0\t-0.1\tH-1\tjump twice and walk left\n")
    proc = _script(script, log, "--ref", ref, "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)[key] == json.loads(
        _script(script, hyps, "--ref", ref, "--json").stdout)[key]
    proc = _script(script, log, "--ref", ref, "--format", "plain")
    assert proc.returncode == 2 and "4 hypothesis lines, but" in proc.stderr


@pytest.mark.parametrize("script", ["score_bleu.py", "score_exact_match.py"])
def test_scorers_reject_empty_files_in_one_line(tmp_path, script):
    empty_hyp, empty_ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    empty_hyp.write_text("")
    empty_ref.write_text("")
    proc = _script(script, empty_hyp, "--ref", empty_ref)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == f"{script}: error: no sentences to score (empty hypothesis " \
        "and reference files?)"
    assert proc.stdout == ""


def _task(extra=()):
    from fairseq_plugins.tasks.seq2seq_eval import Seq2SeqEvalTask

    args = parse_args("transformer_tiny", ["--eval-exact-match", *extra], task="seq2seq_eval")
    d = Dictionary()
    return Seq2SeqEvalTask(args, d, d), args


def _reduce(task, args, logging_outputs):
    from fairseq.criterions.cross_entropy import CrossEntropyCriterion

    base = {"loss": 1.0, "nll_loss": 1.0, "ntokens": 1, "nsentences": 1, "sample_size": 1}
    with metrics.aggregate() as agg:
        task.reduce_metrics([{**base, **o} for o in logging_outputs],
                            CrossEntropyCriterion(task, False))
        return agg.get_smoothed_values()


def test_validation_metrics_are_summed_across_batches(tmp_path):
    lexicon = tmp_path / "lexicon"
    lexicon.write_text("every\t每\ndog\t狗\n", encoding="utf-8")
    compound = tmp_path / "valid.compound"
    compound.write_text("every dog\n" * 15)
    task, args = _task(["--eval-cter", "--eval-cter-compound", compound,
                        "--eval-cter-lexicon", lexicon])
    # three compounds; batch 1 saw compound 0 (1 wrong) and part of 1; batch 2 the rest
    outs = [
        {"_em_correct": 3, "_em_count": 4, "_cter_wrong": 1.0, "_cter_count": 7,
         "_cter_group_wrong": torch.tensor([1.0, 0, 0]), "_cter_group_seen": torch.tensor([5.0, 2, 0])},
        {"_em_correct": 1, "_em_count": 4, "_cter_wrong": 2.0, "_cter_count": 8,
         "_cter_group_wrong": torch.tensor([0.0, 0, 2]), "_cter_group_seen": torch.tensor([0.0, 3, 5])},
    ]
    stats = _reduce(task, args, outs)
    assert stats["exact_match"] == 50.0
    assert stats["cter_instance"] == 20.0  # 3 of 15
    assert stats["cter_aggregate"] == pytest.approx(66.67)  # compounds 0 and 2 of 3


def test_cter_task_flags_are_checked_at_setup(tmp_path):
    with pytest.raises(ValueError, match="--eval-cter needs --eval-cter-compound"):
        _task(["--eval-cter"])
    bad = tmp_path / "c"
    bad.write_text("every dog\n" * 4)
    lexicon = tmp_path / "lexicon"
    lexicon.write_text("every\t每\n")
    with pytest.raises(ValueError, match="4 lines is not a positive multiple of 5"):
        _task(["--eval-cter", "--eval-cter-compound", bad, "--eval-cter-lexicon", lexicon])


def test_train_selects_best_checkpoint_on_exact_match(scan_bin):
    ckpt = train(scan_bin, "transformer_tiny", "--task", "seq2seq_eval", "--eval-exact-match",
                 "--eval-bleu", "--eval-bleu-args", '{"beam": 2, "max_len_a": 0, "max_len_b": 60}',
                 "--best-checkpoint-metric", "exact_match", "--maximize-best-checkpoint-metric",
                 "--validate-interval-updates", "10", updates=20, name="em")
    log = (ckpt.parent / "train.log").read_text()
    valid = [line for line in log.splitlines() if "| valid on 'valid' subset" in line]
    assert valid and all("| exact_match " in line and "| bleu " in line for line in valid)
    assert (ckpt.parent / "checkpoint_best.pt").exists()
    # the best checkpoint's score is the exact match of the last validation, not the loss
    last_em = float(valid[-1].split("| exact_match ")[1].split(" ")[0])
    saved = [line for line in log.splitlines() if "Saved checkpoint" in line and "_best" in line]
    assert saved and f"score {last_em})" in saved[-1]


def _write_cognition_like(tmp_path):
    """10 sentence pairs = 2 compounds x 5 contexts, character-tokenised Chinese targets."""
    en = ["every dog barked .", "i saw every dog .", "every dog ran .", "every dog ate .",
          "every dog slept ."] + ["the small dog barked .", "i saw the small dog .",
                                  "the small dog ran .", "the small dog ate .",
                                  "the small dog slept ."]
    zh = ["每 只 狗 都 叫 了 。"] * 5 + ["那 只 小 狗 叫 了 。"] * 5
    text = tmp_path / "text"
    text.mkdir()
    for split in ("train", "valid"):
        (text / f"{split}.en").write_text("\n".join(en) + "\n")
        (text / f"{split}.zh").write_text("\n".join(zh) + "\n")
    compound = tmp_path / "valid.compound"
    compound.write_text("every dog\n" * 5 + "the small dog\n" * 5)
    lexicon = tmp_path / "lexicon"
    lexicon.write_text("the\t/\nevery\t每/所有\nsmall\t小\ndog\t狗\n", encoding="utf-8")
    run_cli("fairseq-preprocess", "--source-lang", "en", "--target-lang", "zh",
            "--trainpref", text / "train", "--validpref", text / "valid",
            "--destdir", tmp_path / "bin", "--workers", "1")
    return tmp_path / "bin", compound, lexicon


def test_train_logs_cter_on_validation(tmp_path):
    data, compound, lexicon = _write_cognition_like(tmp_path)
    common = [data, "--user-dir", PLUGIN_DIR, "--task", "seq2seq_eval", "--arch",
              "transformer_tiny", "--optimizer", "adam", "--lr", "5e-3", "--max-tokens", "512",
              "--max-update", "30", "--save-dir", tmp_path / "ckpt", "--num-workers", "0",
              "--eval-cter", "--eval-cter-lexicon", lexicon,
              "--eval-bleu-args", '{"beam": 1, "max_len_a": 0, "max_len_b": 12}',
              "--no-save", "--dropout", "0"]
    out = run_cli("fairseq-train", *common, "--eval-cter-compound", compound)
    valid = [line for line in out.splitlines() if "| valid on 'valid' subset" in line]
    assert valid and "| cter_instance " in valid[-1] and "| cter_aggregate " in valid[-1]
    final = dict(kv.strip().split(" ", 1) for kv in valid[-1].split("|")[3:] if " " in kv.strip())
    # the model memorises its 10 training pairs: every compound is then translated correctly
    assert float(final["cter_instance"]) == 0.0 and float(final["cter_aggregate"]) == 0.0

    short = tmp_path / "short.compound"
    short.write_text("every dog\n" * 5)
    proc = run_cli("fairseq-train", *common, "--eval-cter-compound", short, check=False)
    assert proc.returncode != 0
    assert "subset 'valid' has 10 sentences but" in proc.stdout + proc.stderr
