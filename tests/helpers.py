"""Build tiny dictionaries, translation tasks and models in-process (no data on disk)."""
import os
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN_DIR = os.path.join(REPO, "fairseq_plugins")
SCRIPTS = os.path.join(REPO, "scripts")
SHARED_DATA = os.path.join(os.path.dirname(REPO), "shared", "data")

if REPO not in sys.path:
    sys.path.insert(0, REPO)

import fairseq_plugins  # noqa: E402,F401  (registers everything)
from fairseq import options, tasks  # noqa: E402
from fairseq.data import Dictionary  # noqa: E402


def make_dict(n_symbols=20, prefix="w"):
    d = Dictionary()
    for i in range(n_symbols):
        d.add_symbol(f"{prefix}{i}")
    d.finalize(padding_factor=1)
    return d


def parse_args(arch, extra=(), task="translation"):
    """Namespace exactly as fairseq-train would build it for ``--arch arch extra...``."""
    parser = options.get_training_parser()
    argv = ["/nonexistent-data", "--task", task, "--arch", arch, "--user-dir", PLUGIN_DIR,
            *map(str, extra)]
    return options.parse_args_and_arch(parser, input_args=argv)


def build_translation_model(arch, extra=(), src_dict=None, tgt_dict=None, seed=0):
    """(model, task, args) for a seq2seq ``arch`` over tiny dictionaries."""
    args = parse_args(arch, extra)
    src_dict = src_dict or make_dict(20, "s")
    tgt_dict = tgt_dict or make_dict(20, "t")
    task = tasks.get_task("translation")(args, src_dict, tgt_dict)
    torch.manual_seed(seed)
    model = task.build_model(args)
    return model, task, args


def random_batch(src_dict, tgt_dict, bsz=3, src_len=7, tgt_len=6, seed=0, pad_last=True):
    """A translation batch with source left-padding like fairseq's default collater."""
    g = torch.Generator().manual_seed(seed)
    nspecial = src_dict.nspecial
    src = torch.randint(nspecial, len(src_dict), (bsz, src_len), generator=g)
    src[:, -1] = src_dict.eos()
    lengths = torch.full((bsz,), src_len, dtype=torch.long)
    if pad_last and bsz > 1:  # shorter last sentence, left-padded
        src[-1, :2] = src_dict.pad()
        lengths[-1] = src_len - 2
    prev = torch.randint(tgt_dict.nspecial, len(tgt_dict), (bsz, tgt_len), generator=g)
    prev[:, 0] = tgt_dict.eos()
    return src, lengths, prev


def incremental_decode(model, src, lengths, prev):
    """Decoder outputs step by step with fairseq's incremental state: B x T x V."""
    enc = model.encoder(src, src_lengths=lengths)
    state = {}
    outs = []
    for t in range(prev.size(1)):
        out, _ = model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)
        outs.append(out)
    return torch.cat(outs, dim=1)


def beam_search(model, task, src, lengths, beam=4, max_len_b=12):
    """fairseq's SequenceGenerator (the one fairseq-generate uses) on one batch."""
    from fairseq import search
    from fairseq.sequence_generator import SequenceGenerator

    gen = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_b=max_len_b,
                            search_strategy=search.BeamSearch(task.target_dictionary))
    return gen.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
