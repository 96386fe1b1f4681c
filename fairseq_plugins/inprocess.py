"""Build fairseq tasks and models in-process from command-line style flags.

For tests, benchmarks and notebooks: ``build_translation_model("fusion_transformer_tiny",
["--fusion-layers", "1"])`` returns exactly the model ``fairseq-train --arch ...`` would build,
over small in-memory dictionaries, without data on disk.
"""
import os

import torch

from fairseq import options, tasks
from fairseq.data import Dictionary

PLUGIN_DIR = os.path.dirname(os.path.abspath(__file__))


def make_dict(n_symbols=20, prefix="w"):
    """A fairseq Dictionary of the 4 specials plus ``n_symbols`` words ``<prefix><i>``."""
    d = Dictionary()
    for i in range(n_symbols):
        d.add_symbol(f"{prefix}{i}")
    d.finalize(padding_factor=1)
    return d


def parse_args(arch, extra=(), task="translation"):
    """The Namespace fairseq-train builds for ``--task task --arch arch extra...``."""
    parser = options.get_training_parser()
    argv = ["/nonexistent-data", "--task", task, "--arch", arch, "--user-dir", PLUGIN_DIR,
            *map(str, extra)]
    return options.parse_args_and_arch(parser, input_args=argv)


def build_translation_model(arch, extra=(), src_dict=None, tgt_dict=None, seed=0):
    """(model, task, args) for a seq2seq ``arch`` over the given (or tiny) dictionaries."""
    args = parse_args(arch, extra)
    src_dict = src_dict or make_dict(20, "s")
    tgt_dict = tgt_dict or make_dict(20, "t")
    task = tasks.get_task("translation")(args, src_dict, tgt_dict)
    torch.manual_seed(seed)
    model = task.build_model(args)
    return model, task, args


def beam_search(model, task, src, lengths, beam=4, max_len_b=12, max_len_a=0, min_len=1):
    """fairseq's SequenceGenerator (the one fairseq-generate uses) on one batch."""
    from fairseq import search
    from fairseq.sequence_generator import SequenceGenerator

    gen = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_a=max_len_a,
                            max_len_b=max_len_b, min_len=min_len,
                            search_strategy=search.BeamSearch(task.target_dictionary))
    return gen.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})


def build_language_model(arch, extra=(), dictionary=None, seed=0):
    """(model, task, args) for a ``language_modeling`` ``arch`` over ``dictionary`` (or a tiny
    one), as ``fairseq-train --task language_modeling`` would build it."""
    from fairseq.tasks.language_modeling import LanguageModelingTask

    args = parse_args(arch, extra, task="language_modeling")
    dictionary = dictionary or make_dict(20, "w")
    task = LanguageModelingTask(args, dictionary, dictionary)
    torch.manual_seed(seed)
    model = task.build_model(args)
    return model, task, args
