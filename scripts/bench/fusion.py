#!/usr/bin/env python3
"""Speed and memory of layer-wise fusion against fairseq's transformer, in one run (JSON).

    python scripts/bench/fusion.py [--quick] [--device cuda --fp16] [--out results/bench_fusion.json]

Measures, for fairseq ``transformer`` and ``layerwise_transformer`` with encoder+decoder,
encoder-only and decoder-only fusion at the same sizes (default 3+3 layers, d=256, FFN 1024,
4 heads, 4096 target tokens per batch): training target tokens/s (median of timed windows of
forward + backward + Adam step), peak memory growth during training, and beam-5 generation
sentences/s. Prints the ratios to the transformer next to the MAC-model ratio (``flops.py``):
``mac_model_ratio`` counts fuse-attention as SPEC describes it (MHA over the lower states, the
issue's FLOP model); ``mac_ratio_implemented`` counts the cheaper algebra FuseAttention runs. Absolute numbers are only meaningful on a GPU; ratios are the result.
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import flops  # noqa: E402

VARIANTS = {
    "transformer": ("transformer", []),
    "fusion": ("layerwise_transformer", ["--encoder-fusion", "--decoder-fusion"]),
    "fusion_enc": ("layerwise_transformer", ["--encoder-fusion"]),
    "fusion_dec": ("layerwise_transformer", ["--decoder-fusion"]),
}


def size_flags(cfg):
    return ["--encoder-layers", cfg["layers"], "--decoder-layers", cfg["layers"],
            "--encoder-embed-dim", cfg["d"], "--decoder-embed-dim", cfg["d"],
            "--encoder-ffn-embed-dim", cfg["ffn"], "--decoder-ffn-embed-dim", cfg["ffn"],
            "--encoder-attention-heads", cfg["heads"], "--decoder-attention-heads", cfg["heads"]]


def worker(job):
    from fairseq_plugins.inprocess import beam_search, build_translation_model, make_dict

    cfg, device = job["cfg"], job["device"]
    torch.set_num_threads(job["threads"])
    arch, flags = VARIANTS[job["variant"]]
    vocab = make_dict(cfg["vocab"] - 4, "w")
    model, task, _ = build_translation_model(arch, size_flags(cfg) + flags, vocab, vocab, seed=1)
    dtype = torch.float16 if job["fp16"] else torch.float32
    model = model.to(device=device, dtype=dtype)
    g = torch.Generator().manual_seed(0)
    bsz = cfg["max_tokens"] // cfg["tgt_len"]

    def tokens(n, length):
        t = torch.randint(vocab.nspecial, len(vocab), (n, length), generator=g)
        t[:, -1] = vocab.eos()
        return t.to(device)

    src, tgt = tokens(bsz, cfg["src_len"]), tokens(bsz, cfg["tgt_len"])
    lengths = torch.full((bsz,), cfg["src_len"], device=device)
    prev = torch.cat([tgt[:, -1:], tgt[:, :-1]], dim=1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, eps=1e-4 if job["fp16"] else 1e-8)
    mem0 = common.memory_start(device)

    def train_step():
        model.train()
        out, _ = model(src, lengths, prev)
        loss = F.cross_entropy(out.float().view(-1, out.size(-1)), tgt.view(-1), reduction="sum")
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    w = job["windows"]
    train_times = common.timed_windows(train_step, w["train"], w["steps"], w["warmup"], device)
    mem = common.memory_peak_growth(device, mem0)

    model.eval()
    gsrc = tokens(cfg["gen_sentences"], cfg["src_len"])
    glen = torch.full((cfg["gen_sentences"],), cfg["src_len"], device=device)

    def gen_step():
        with torch.no_grad():
            beam_search(model, task, gsrc, glen, beam=5, max_len_b=cfg["tgt_len"])

    gen_times = common.timed_windows(gen_step, w["gen"], 1, 1, device)
    t_train = common.median(train_times)
    t_gen = common.median(gen_times)
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "train_seconds_per_update": t_train,
        "train_tokens_per_second": bsz * cfg["tgt_len"] / t_train,
        "train_peak_memory_growth_mb": round(mem, 1),
        "generate_seconds": t_gen,
        "generate_sentences_per_second": cfg["gen_sentences"] / t_gen,
    }


def mac_ratio(variant, cfg, algorithm):
    d, L = cfg["d"], cfg["layers"]
    base = flops.transformer_macs(d, cfg["ffn"], L, L, cfg["src_len"], cfg["tgt_len"], cfg["vocab"])
    extra = 0
    for side, length in (("enc", cfg["src_len"]), ("dec", cfg["tgt_len"])):
        if variant in ("fusion", f"fusion_{side}"):
            extra += flops.fusion_extra_macs(d, cfg["heads"], range(L), length, algorithm=algorithm)
    return (base + extra) / base


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, few windows (CI smoke)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--fp16", action="store_true", help="half precision (GPU only)")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return 0
    if args.fp16 and args.device == "cpu":
        p.error("--fp16 needs --device cuda")

    if args.quick:
        cfg = dict(layers=2, d=64, ffn=128, heads=4, vocab=500, src_len=16, tgt_len=16,
                   max_tokens=512, gen_sentences=8)
        windows = dict(train=2, steps=1, warmup=1, gen=1)
    else:
        cfg = dict(layers=3, d=256, ffn=1024, heads=4, vocab=8000, src_len=32, tgt_len=32,
                   max_tokens=4096, gen_sentences=64)
        windows = dict(train=7, steps=3, warmup=3, gen=7)
    results = {}
    for variant in args.variants.split(","):
        job = dict(variant=variant, cfg=cfg, device=args.device, fp16=args.fp16,
                   threads=args.threads, windows=windows)
        print(f"[bench] {variant} ...", file=sys.stderr, flush=True)
        results[variant] = common.run_isolated(os.path.abspath(__file__), job, args.threads)
    base = results.get("transformer")
    ratios = {}
    if base:
        for variant, r in results.items():
            if variant == "transformer":
                continue
            train_ratio = r["train_seconds_per_update"] / base["train_seconds_per_update"]
            naive = mac_ratio(variant, cfg, "naive")
            implemented = mac_ratio(variant, cfg, "implemented")
            ratios[variant] = {
                "train_time_ratio": round(train_ratio, 3),
                "mac_model_ratio": round(naive, 3),
                "train_ratio_over_mac_ratio": round(train_ratio / naive, 3),
                "mac_ratio_implemented": round(implemented, 3),
                "train_ratio_over_mac_ratio_implemented": round(train_ratio / implemented, 3),
                "generate_speed_ratio": round(r["generate_sentences_per_second"]
                                              / base["generate_sentences_per_second"], 3),
                "memory_growth_ratio": round(r["train_peak_memory_growth_mb"]
                                             / max(base["train_peak_memory_growth_mb"], 1e-9), 3),
                "params_extra": r["params"] - base["params"],
            }
    report = {"benchmark": "fusion", "device": args.device, "fp16": args.fp16,
              "threads": args.threads, "torch": torch.__version__, "config": cfg,
              "windows": windows, "results": results, "ratios_vs_transformer": ratios,
              "targets": {"train_ratio_over_mac_ratio": "<= 1.15",
                          "generate_speed_ratio": ">= 0.8"}}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
