#!/usr/bin/env python3
"""Speed and memory of this package's seq2seq features against fairseq's transformer, in one
run (JSON).

    python scripts/bench/seq2seq.py [--quick] [--variants fusion,bridge] [--device cuda --fp16]
        [--out results/bench_seq2seq_cpu.json]

Measures, for fairseq ``transformer`` and ``layerwise_transformer`` variants at the same sizes
(default 3+3 layers, d=256, FFN 1024, 4 heads, 4096 target tokens per batch): encoder+decoder,
encoder-only and decoder-only fusion, the FC bridge and the cross-attention variants (plus the peak
memory of one swapped cross-attention module as the target length grows). Training target tokens/s
(timed windows of forward + backward + Adam step) and beam-5 generation sentences/s are measured
with the variant and the baseline in one process, in alternating windows, each ratio the median
over the windows of the ratio within a window pair, so that machine drift cannot pass for a
difference; peak memory growth during training in a process per model.
Prints the ratios to the transformer next to the MAC-model ratio (each sub-layer's ``macs``): for fusion,
``mac_model_ratio`` counts fuse-attention as the LRF paper describes it (MHA over the lower states,
the issue's FLOP model) and ``mac_ratio_implemented`` the cheaper algebra FuseAttention runs; for
the bridge both are N_dec x N x d^2 per source token. Absolute numbers are only meaningful on a
GPU; ratios are the result.
"""
import os
import sys

import torch
import torch.nn.functional as F

from fairseq_plugins.modules import cross_attention
from fairseq_plugins.depth.dwa import DepthWeightedAverage, dwa_inputs
from fairseq_plugins.depth.lrf import FuseAttention
from fairseq_plugins.modules.layer_bridge import LayerBridge
from fairseq_plugins.modules.transparent_attention import TransparentAttention
from fairseq_plugins.modules.transformer_macs import transformer_macs
from layerlab import bench as common

BASELINE = "transformer"
VARIANTS = {
    BASELINE: ("transformer", []),
    "fusion": ("layerwise_transformer", ["--encoder-fusion", "--decoder-fusion"]),
    "fusion_enc": ("layerwise_transformer", ["--encoder-fusion"]),
    "fusion_dec": ("layerwise_transformer", ["--decoder-fusion"]),
    # the same fusion, its fuse-attention recomputed in the backward pass (--fusion-recompute)
    "fusion_recompute": ("layerwise_transformer", ["--encoder-fusion", "--decoder-fusion",
                                                   "--fusion-recompute"]),
    "bridge": ("layerwise_transformer", ["--bridge", "fc"]),
    "dwa": ("layerwise_transformer", ["--encoder-fusion", "--decoder-fusion",
                                      "--fusion-kind", "dwa"]),
    "transparent": ("layerwise_transformer", ["--bridge", "transparent"]),
    "swapped": ("layerwise_transformer", ["--cross-attention", "swapped"]),
    "inverted": ("layerwise_transformer", ["--cross-attention", "inverted"]),
    "decoder_values": ("layerwise_transformer", ["--cross-attention", "decoder-values"]),
}
CROSS_ATTENTION = {"swapped": "swapped", "inverted": "inverted", "decoder_values": "decoder-values"}


def size_flags(cfg):
    return ["--encoder-layers", cfg["layers"], "--decoder-layers", cfg["layers"],
            "--encoder-embed-dim", cfg["d"], "--decoder-embed-dim", cfg["d"],
            "--encoder-ffn-embed-dim", cfg["ffn"], "--decoder-ffn-embed-dim", cfg["ffn"],
            "--encoder-attention-heads", cfg["heads"], "--decoder-attention-heads", cfg["heads"]]


class Bench:
    """One model with its synthetic training batch, optimizer and generation batch."""

    def __init__(self, arch, flags, cfg, device, fp16, dictionaries=None):
        """``flags``: every flag of the model (sizes included); ``dictionaries``: (source,
        target) fairseq Dictionaries, by default one synthetic vocabulary of ``cfg["vocab"]``
        symbols on both sides."""
        from fairseq_plugins.inprocess import build_translation_model, make_dict

        source, vocab = dictionaries or (make_dict(cfg["vocab"] - 4, "w"),) * 2
        model, self.task, _ = build_translation_model(arch, list(flags), source, vocab, seed=1)
        dtype = torch.float16 if fp16 else torch.float32
        self.model = model.to(device=device, dtype=dtype)
        self.params = sum(p.numel() for p in model.parameters())
        g = torch.Generator().manual_seed(0)  # same data for every variant

        def tokens(n, length, d=vocab):
            t = torch.randint(d.nspecial, len(d), (n, length), generator=g)
            t[:, -1] = d.eos()
            return t.to(device)

        # fairseq's --max-tokens bounds sentences x the longer side's length
        self.bsz, self.cfg = cfg["max_tokens"] // max(cfg["src_len"], cfg["tgt_len"]), cfg
        self.src = tokens(self.bsz, cfg["src_len"], source)
        self.tgt = tokens(self.bsz, cfg["tgt_len"])
        self.lengths = torch.full((self.bsz,), cfg["src_len"], device=device)
        self.prev = torch.cat([self.tgt[:, -1:], self.tgt[:, :-1]], dim=1)
        self.gsrc = tokens(cfg["gen_sentences"], cfg["src_len"], source)
        self.glen = torch.full((cfg["gen_sentences"],), cfg["src_len"], device=device)
        self.opt = torch.optim.Adam(model.parameters(), lr=1e-4, eps=1e-4 if fp16 else 1e-8)

    def train_step(self):
        self.model.train()
        out, _ = self.model(self.src, self.lengths, self.prev)
        loss = F.cross_entropy(out.float().view(-1, out.size(-1)), self.tgt.view(-1),
                               reduction="sum")
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def generate(self):
        from fairseq_plugins.inprocess import beam_search

        self.model.eval()
        with torch.no_grad():
            # every hypothesis runs all tgt_len steps (EOS is blocked until then): the variants
            # do the same decoding work, whatever lengths their (briefly trained) weights prefer
            beam_search(self.model, self.task, self.gsrc, self.glen, beam=5,
                        max_len_b=self.cfg["tgt_len"], min_len=self.cfg["tgt_len"])


def bench_of(job, name):
    """The Bench of model ``name`` of a job: one of ``job["models"]`` ({name: (architecture,
    every flag)}) over the dictionaries ``job["dictionaries"]`` names (source and target
    paths) where the job has them (scripts/bench/encdec.py's), else one of VARIANTS at the
    job's sizes over a synthetic vocabulary."""
    if "models" in job:
        from fairseq.data import Dictionary

        arch, flags = job["models"][name]
        dictionaries = [Dictionary.load(path) for path in job["dictionaries"]]
    else:
        arch, flags = VARIANTS[name][0], size_flags(job["cfg"]) + VARIANTS[name][1]
        dictionaries = None
    return Bench(arch, flags, job["cfg"], job["device"], job["fp16"], dictionaries)


def worker(job):
    """``memory``: peak memory growth of one variant's training (a process of its own);
    ``speed``: the variant and the baseline in one process, timed in alternating windows
    (order flipped every window) so that machine drift affects both alike; generation only
    where ``windows["gen"]`` is above 0."""
    torch.set_num_threads(job["threads"])
    if job["mode"] == "cross_attention_memory":
        return cross_attention_memory(job)
    cfg, device, w = job["cfg"], job["device"], job["windows"]
    if job["mode"] == "memory":
        bench = bench_of(job, job["variant"])
        start = common.memory_start(device)
        for _ in range(w["warmup"] + w["steps"]):
            bench.train_step()
        return {"params": bench.params,
                "train_peak_memory_growth_mb": round(common.memory_peak_growth(device, start), 1)}
    names = [job["baseline"], job["variant"]]
    benches = {n: bench_of(job, n) for n in names}
    times = {n: {"train": [], "gen": []} for n in names}
    for kind, windows, steps in (("train", w["train"], w["steps"]), ("gen", w["gen"], 1)):
        if not windows:
            continue
        for n in names:  # warm-up
            for _ in range(w["warmup"] if kind == "train" else 1):
                getattr(benches[n], "train_step" if kind == "train" else "generate")()
        for i in range(windows):
            for n in (names if i % 2 == 0 else names[::-1]):
                step = getattr(benches[n], "train_step" if kind == "train" else "generate")
                times[n][kind] += common.timed_windows(step, 1, steps, 0, device)
    out = {}
    for n in names:
        t_train = common.median(times[n]["train"])
        # per window too: the ratios are taken window by window (layerlab.bench.paired_ratio)
        out[n] = {"train_seconds_per_update": t_train,
                  "train_tokens_per_second": benches[n].bsz * cfg["tgt_len"] / t_train,
                  "train_seconds_per_round": times[n]["train"]}
        if times[n]["gen"]:
            t_gen = common.median(times[n]["gen"])
            out[n].update(generate_seconds=t_gen,
                          generate_sentences_per_second=cfg["gen_sentences"] / t_gen,
                          generate_seconds_per_round=times[n]["gen"])
    return out


def measure_against(script, job, baseline, others, threads, together=False):
    """Each model's peak memory growth of training (``script``'s worker in mode ``memory``, a
    process per model) and each of ``others`` timed against ``baseline`` in one process (mode
    ``speed``) -> ({name: its memory result, with its speed figures and the baseline's of the
    same process merged in for the others}, {other: its speed pair}). ``together``: every job
    in one process (--quick)."""
    names = [baseline, *others]
    results = dict(zip(names, common.run_jobs(
        script, [dict(job, mode="memory", variant=n) for n in names], threads,
        [f"{n}: memory" for n in names], together=together)))
    pairs = dict(zip(others, common.run_jobs(
        script, [dict(job, mode="speed", variant=n, baseline=baseline) for n in others],
        threads, [f"{n} vs {baseline}: speed (interleaved)" for n in others],
        together=together)))
    for name, pair in pairs.items():
        results[name].update(pair[name])
        results[name]["baseline_in_same_process"] = pair[baseline]
    return results, pairs


def mac_ratio(variant, cfg, algorithm):
    """(transformer + the variant's extra sub-layers) / transformer, in forward MACs of one
    (source, target) pair; each sub-layer's count is its module's own (``macs``)."""
    d, L, heads = cfg["d"], cfg["layers"], cfg["heads"]
    base = transformer_macs(d, cfg["ffn"], L, L, cfg["src_len"], cfg["tgt_len"], cfg["vocab"])
    extra = 0
    for side, length in (("enc", cfg["src_len"]), ("dec", cfg["tgt_len"])):
        if variant in ("fusion", f"fusion_{side}", "fusion_recompute"):
            # layer i (0-based) attends over the embedding output and the i layers below it
            extra += length * sum(FuseAttention.macs(d, heads, i + 1, algorithm)
                                  for i in range(L))
        if variant == "dwa":  # an average after every layer s over the states 0..s
            extra += length * sum(DepthWeightedAverage.macs(d, len(dwa_inputs(s, 1)))
                                  for s in range(1, L + 1))
    if variant == "bridge":
        extra += LayerBridge.macs(d, L, L, cfg["src_len"])
    if variant == "transparent":
        extra += TransparentAttention.macs(d, L + 1, L, cfg["src_len"])
    if variant in CROSS_ATTENTION:
        extra += L * cross_attention.extra_macs(CROSS_ATTENTION[variant], d, heads,
                                                cfg["src_len"], cfg["tgt_len"])
    return (base + extra) / base


def cross_attention_memory(job):
    """Peak memory growth of one decoder cross-attention module's forward + backward (B=16,
    S=32, d=256, 4 heads) at the job's target length: shows how memory grows with T."""
    from fairseq.modules.multihead_attention import MultiheadAttention
    from fairseq_plugins.modules.swapped_cross_attention import SwappedCrossAttention

    torch.manual_seed(0)
    d, bsz, src_len, tgt_len = 256, 16, 32, job["tgt_len"]
    module = (SwappedCrossAttention(d, 4) if job["variant"] == "swapped"
              else MultiheadAttention(d, 4, encoder_decoder_attention=True)).to(job["device"])
    x = torch.randn(tgt_len, bsz, d, device=job["device"], requires_grad=True)
    memory = torch.randn(src_len, bsz, d, device=job["device"])
    start = common.memory_start(job["device"])
    out, _ = module(x, memory, memory, need_weights=False)
    out.sum().backward()
    return {"peak_memory_growth_mb": round(common.memory_peak_growth(job["device"], start), 1)}


def markdown_table(report):
    c, w = report["config"], report["windows"]
    lines = [f"{report['device']}{' fp16' if report['fp16'] else ''}, {report['threads']} threads, "
             f"torch {report['torch']}: {c['layers']}+{c['layers']} layers, d={c['d']}, "
             f"FFN {c['ffn']}, {c['heads']} heads, vocab {c['vocab']}, {c['max_tokens']} target "
             f"tokens per batch (source/target length {c['src_len']}/{c['tgt_len']}); training: "
             f"median of {w['train']} windows of {w['steps']} updates; generation: beam 5, "
             f"{c['gen_sentences']} sentences of {c['tgt_len']} steps each (EOS blocked until "
             f"then), median of {w['gen']} runs. Ratios to fairseq's `transformer` in the same "
             "run.", "",
             "| variant | extra params | training time ratio | MAC-model ratio | measured / MAC "
             "model | MAC ratio as implemented | measured / implemented | generation speed "
             "ratio | training peak-memory growth ratio |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in report["ratios_vs_transformer"].items():
        lines.append(f"| {name} | {r['params_extra']:,} | {r['train_time_ratio']:.3f} | "
                     f"{r['mac_model_ratio']:.3f} | **{r['train_ratio_over_mac_ratio']:.3f}** | "
                     f"{r['mac_ratio_implemented']:.3f} | "
                     f"{r['train_ratio_over_mac_ratio_implemented']:.3f} | "
                     f"**{r['generate_speed_ratio']:.3f}** | {r['memory_growth_ratio']:.3f} |")
    return "\n".join(lines)


def parser():
    p = common.bench_parser(__doc__.split("\n\n")[0])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--markdown", help="also write a markdown table of the ratios here")
    return p


def run(args):
    """The report (a dict) for parsed options; also used by run.py."""
    if args.quick:
        # beam search over 8 steps of 2 sentences: generation was half of the quick run's time
        cfg = dict(layers=2, d=64, ffn=128, heads=4, vocab=500, src_len=16, tgt_len=8,
                   max_tokens=512, gen_sentences=2)
        windows = dict(train=2, steps=1, warmup=1, gen=1)
    else:
        cfg = dict(layers=3, d=256, ffn=1024, heads=4, vocab=8000, src_len=32, tgt_len=32,
                   max_tokens=4096, gen_sentences=64)
        windows = dict(train=7, steps=3, warmup=3, gen=7)
    # the baseline always: every ratio (memory and parameters too) is against it
    variants = [BASELINE] + [v for v in args.variants.split(",") if v != BASELINE]
    common_job = dict(cfg=cfg, device=args.device, fp16=args.fp16, threads=args.threads,
                      windows=windows)
    script = os.path.abspath(__file__)
    compared = [v for v in variants if v != BASELINE]
    results, pairs = measure_against(script, common_job, BASELINE, compared, args.threads,
                                     together=args.quick)
    ratios = {}
    for variant, pair in pairs.items():
        base, r = pair[BASELINE], pair[variant]
        train_ratio = common.paired_ratio(r, base)
        generate_ratio = common.paired_ratio(r, base, "generate_seconds_per_round")
        naive = mac_ratio(variant, cfg, "naive")
        implemented = mac_ratio(variant, cfg, "implemented")
        base_mem = results.get(BASELINE, {}).get("train_peak_memory_growth_mb")
        ratios[variant] = {
            "train_time_ratio": round(train_ratio, 3),
            "mac_model_ratio": round(naive, 3),
            "train_ratio_over_mac_ratio": round(train_ratio / naive, 3),
            "mac_ratio_implemented": round(implemented, 3),
            "train_ratio_over_mac_ratio_implemented": round(train_ratio / implemented, 3),
            "generate_speed_ratio": round(1 / generate_ratio, 3),
            "generate_time_ratio": generate_ratio,
            "memory_growth_ratio": (round(results[variant]["train_peak_memory_growth_mb"]
                                          / base_mem, 3) if base_mem else None),
            "params_extra": (results[variant]["params"] - results[BASELINE]["params"]
                             if BASELINE in results else None),
        }
    if "transparent" in ratios and "bridge" in ratios:  # each measured against the transformer
        ratios["transparent"]["train_time_ratio_vs_bridge"] = round(
            ratios["transparent"]["train_time_ratio"] / ratios["bridge"]["train_time_ratio"], 3)
    scaling = {}
    if "swapped" in variants:
        # swapped's memory must grow as T x S x chunk, not T^2 x S: the module alone, each
        # (variant, T) in a process of its own
        cases = [(tgt_len, v) for tgt_len in ((16, 32) if args.quick else (32, 64, 128, 256))
                 for v in ("standard", "swapped")]
        peaks = common.run_jobs(script, [
            dict(mode="cross_attention_memory", variant=v, tgt_len=tgt_len, device=args.device,
                 threads=args.threads) for tgt_len, v in cases], args.threads,
            [f"{v} cross-attention at target length {t}: memory" for t, v in cases],
            together=args.quick)
        for (tgt_len, v), peak in zip(cases, peaks):
            scaling.setdefault(tgt_len, {})[v] = peak["peak_memory_growth_mb"]
    report = {"benchmark": "seq2seq", "device": args.device, "fp16": args.fp16,
              "threads": args.threads, "torch": torch.__version__, "config": cfg,
              "windows": windows, "results": results, "ratios_vs_transformer": ratios,
              "cross_attention_memory_mb_by_target_length": scaling,
              "targets": common.describe_targets("seq2seq")}
    return report


def main(argv=None):
    def write_markdown(report, args):
        if args.markdown:
            common.write_text(args.markdown, markdown_table(report))

    return common.bench_main(parser(), worker, run, argv, write_markdown)


if __name__ == "__main__":
    sys.exit(main())
