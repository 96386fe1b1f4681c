#!/usr/bin/env python3
"""Speed and memory of the language models against the decoder-only baseline, in one run (JSON).

    python scripts/bench/lm.py [--quick] [--device cuda --fp16] [--out results/bench_lm_cpu.json]

Training: tokens/s (timed windows of forward + backward + Adam step; the ratio is the median over
the rounds of the two models' ratio within a round) of
``ar_encdec_lm_yif`` (without and with the MSE embedding loss) against ``gpt_baseline_lm_yif``,
the reference sizes with V = 50,257 and context 200, the baseline and both variants taking turns
in one process (each in every slot of the rotation, so that a drifting machine speed hits all
alike); peak memory growth of training in a process per model. Generation: tokens/s of
continuing a 150-token context by 50 tokens with the incremental cache against recomputing the
whole prefix every token (what a model without a cache costs), for both models (the prompt is
fed through the cache untimed: the figure is the cost per generated token at context ~200).
Ratios are the result; absolute numbers only mean something on a GPU.
"""
import os
import sys
import time

import torch

from layerlab import bench as common

BASELINE = "gpt_baseline_lm"
MODELS = {
    BASELINE: ("gpt_baseline_lm_yif", []),
    "ar_encdec_lm": ("ar_encdec_lm_yif", []),
    "ar_encdec_lm_emb_mse": ("ar_encdec_lm_yif", ["--criterion", "lm_embedding_loss",
                                                  "--embedding-loss", "mse"]),
}


class Bench:
    def __init__(self, arch, flags, cfg, device, fp16):
        from fairseq_plugins.inprocess import build_language_model, make_dict

        dictionary = make_dict(cfg["vocab"] - 4, "w")
        model, task, args = build_language_model(
            arch, ["--tokens-per-sample", cfg["context"], *flags], dictionary, seed=1)
        self.model = model.to(device=device, dtype=torch.float16 if fp16 else torch.float32)
        self.criterion = task.build_criterion(args)
        self.params = model.reference_parameter_count()
        g = torch.Generator().manual_seed(0)
        tokens = torch.randint(4, len(dictionary), (cfg["batch"], cfg["context"] + 1), generator=g)
        tokens = tokens.to(device)
        self.sample = {"net_input": {"src_tokens": tokens[:, :-1].contiguous(),
                                     "src_lengths": None},
                       "target": tokens[:, 1:].contiguous(), "ntokens": tokens[:, 1:].numel()}
        self.prompt = tokens[:cfg["gen_batch"], :cfg["gen_context"]]
        self.cfg, self.device = cfg, device
        self.opt = torch.optim.Adam(model.parameters(), lr=1e-4, eps=1e-4 if fp16 else 1e-8)

    def train_step(self):
        self.model.train()
        loss, sample_size, _ = self.criterion(self.model, self.sample)
        (loss / sample_size).backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def generate(self, cached=True):
        """Greedy continuation of the prompt by gen_tokens tokens (the work of sampling) ->
        (tokens, seconds of the gen_tokens steps). With the cache the prompt is first fed
        through it one position at a time, as fairseq's generator does with a prefix, untimed:
        what is compared is the cost per generated token at this context."""
        self.model.eval()
        tokens = self.prompt
        state = {} if cached else None
        with torch.no_grad():
            if cached:
                for t in range(tokens.size(1) - 1):
                    self.model.decoder(tokens[:, :t + 1], incremental_state=state)
            common.sync(self.device)
            start = time.perf_counter()
            for _ in range(self.cfg["gen_tokens"]):
                logits, _ = self.model.decoder(tokens, incremental_state=state)
                tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            common.sync(self.device)
        return tokens, time.perf_counter() - start


def worker(job):
    torch.set_num_threads(job["threads"])
    cfg, device, w = job["cfg"], job["device"], job["windows"]

    def build(name):
        return Bench(*job["models"][name], cfg, device, job["fp16"])

    def memory(name):
        bench = build(name)
        start = common.memory_start(device)
        for _ in range(w["warmup"] + w["steps"]):
            bench.train_step()
        return {"params_reference_count": bench.params,
                "train_peak_memory_growth_mb": round(common.memory_peak_growth(device, start), 1)}

    if job["mode"] == "memory":
        return memory(job["model"])
    if job["mode"] == "generate":
        bench = build(job["model"])
        times, outputs = {}, {}
        for cached in (True, False):
            bench.generate(cached)  # warm-up
            runs = [bench.generate(cached) for _ in range(w["gen"])]
            times[cached] = common.median([seconds for _, seconds in runs])
            outputs[cached] = runs[0][0]
        assert torch.equal(outputs[True], outputs[False]), "the cache changed the output"
        n = cfg["gen_batch"] * cfg["gen_tokens"]
        return {"cached_tokens_per_second": n / times[True],
                "recompute_tokens_per_second": n / times[False],
                "cache_speedup": round(times[False] / times[True], 2)}
    names = list(job["models"])  # the baseline and every variant, interleaved in one process
    benches = {n: build(n) for n in names}
    times = {n: [] for n in names}
    cpu = {n: [0.0, 0.0] for n in names}  # user, system CPU seconds of the timed windows
    for n in names:
        for _ in range(w["warmup"]):
            benches[n].train_step()
    for i in range(w["train"]):
        for n in names[i % len(names):] + names[:i % len(names)]:  # each model in every slot
            before = common.cpu_seconds()
            times[n] += common.timed_windows(benches[n].train_step, 1, w["steps"], 0, device)
            for j, (end, start) in enumerate(zip(common.cpu_seconds(), before)):
                cpu[n][j] += end - start
    tokens = cfg["batch"] * cfg["context"]
    # per round too: a ratio of two models taken round by round cancels the machine's drift
    # over the minutes of the run (what a ratio of the two medians does not)
    return {n: {"train_seconds_per_update": common.median(times[n]),
                "train_tokens_per_second": tokens / common.median(times[n]),
                "train_seconds_per_round": times[n],
                # the kernel's share of the CPU time (page faults, mostly): what the
                # allocator, not the model, costs
                "train_system_share": common.system_share(*cpu[n])} for n in names}


def parser():
    return common.bench_parser(__doc__.split("\n\n")[0])


def run(args):
    """The report (a dict) for parsed options; also used by run.py."""
    models = dict(MODELS)
    if args.quick:  # the *_tiny presets instead of the reference sizes
        models = {n: (arch.replace("_yif", "_tiny"), flags) for n, (arch, flags) in models.items()}
        cfg = dict(vocab=500, context=32, batch=2, gen_batch=1, gen_context=8, gen_tokens=8)
        windows = dict(train=2, steps=1, warmup=1, gen=1)
    else:
        cfg = dict(vocab=50257, context=200, batch=4, gen_batch=1, gen_context=150, gen_tokens=50)
        windows = dict(train=9, steps=2, warmup=1, gen=3)
    script = os.path.abspath(__file__)
    job = dict(cfg=cfg, device=args.device, fp16=args.fp16, threads=args.threads,
               windows=windows, models=models)
    results, ratios = {}, {}
    cases = [(name, mode) for name in models for mode in ("memory", "generate")]
    measured = common.run_jobs(script, [dict(job, mode=mode, model=name) for name, mode in cases],
                               args.threads, [f"{name}: {mode}" for name, mode in cases],
                               together=args.quick)
    for (name, _), result in zip(cases, measured):
        results.setdefault(name, {}).update(result)
    print(f"[bench] {', '.join(models)}: training (interleaved in one process) ...",
          file=sys.stderr, flush=True)
    train = common.run_isolated(script, dict(job, mode="train"), args.threads,
                                forkable=args.quick)
    base_mem = results[BASELINE]["train_peak_memory_growth_mb"]
    for name in models:
        results[name].update(train[name])
        if name == BASELINE:
            continue
        ratios[name] = {
            # tokens/s: the median over the rounds of the baseline's time / the model's
            "train_tokens_per_second_ratio": common.paired_ratio(train[BASELINE], train[name]),
            "memory_growth_ratio": round(results[name]["train_peak_memory_growth_mb"] / base_mem, 3)
            if base_mem > 0 else None,
        }
    report = {"benchmark": "lm", "device": args.device, "fp16": args.fp16,
              "threads": args.threads, "torch": torch.__version__, "config": cfg,
              "windows": windows, "models": models,
              "results": results, "ratios_vs_gpt_baseline_lm": ratios,
              "cache_speedup": {n: results[n]["cache_speedup"] for n in models},
              "targets": common.describe_targets("lm")}
    return report


def markdown_table(report):
    c = report["config"]
    lines = [f"{report['device']}{' fp16' if report['fp16'] else ''}, {report['threads']} threads, "
             f"torch {report['torch']}: vocabulary {c['vocab']:,}, context {c['context']}, "
             f"batch {c['batch']}; generation: batch {c['gen_batch']}, {c['gen_tokens']} tokens "
             f"after a {c['gen_context']}-token prompt. Ratios to `{BASELINE}` in the same "
             "process.", "",
             "| model | training tokens/s ratio | training peak-memory growth ratio | "
             "cached generation tokens/s | cache speedup over recomputing |",
             "|---|---:|---:|---:|---:|"]
    for name, r in report["results"].items():
        ratio = report["ratios_vs_gpt_baseline_lm"].get(name, {})
        lines.append(f"| {name} | {ratio.get('train_tokens_per_second_ratio', 1.0):.3f} | "
                     f"{ratio.get('memory_growth_ratio', 1.0) or float('nan'):.3f} | "
                     f"{r['cached_tokens_per_second']:.1f} | **{r['cache_speedup']:.2f}** |")
    return "\n".join(lines)


def main(argv=None):
    return common.bench_main(parser(), worker, run, argv)


if __name__ == "__main__":
    sys.exit(main())
