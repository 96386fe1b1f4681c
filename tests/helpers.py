"""Build tiny dictionaries, translation tasks and models in-process (no data on disk)."""
import os

import torch

from fairseq_plugins.inprocess import (  # noqa: F401  (re-exported for the tests)
    PLUGIN_DIR,
    beam_search,
    build_language_model,
    build_translation_model,
    make_dict,
    parse_args,
)
from layerlab.paths import load_script  # noqa: F401  (re-exported for the tests)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(REPO, "scripts")
SHARED_DATA = os.path.join(os.path.dirname(REPO), "shared", "data")


def assert_starts_as(model, base, task):
    """Load fairseq model ``base``'s state dict strictly into ``model`` and check that both give
    identical outputs on a random batch; return a function giving the largest difference now
    (to show, after a change, that the new part is really in the path)."""
    model.load_state_dict(base.state_dict(), strict=True)
    src, lengths, prev = random_batch(task.source_dictionary, task.target_dictionary)
    base.eval(), model.eval()
    expected = base(src, lengths, prev)[0]
    assert torch.equal(model(src, lengths, prev)[0], expected)
    return lambda: (model(src, lengths, prev)[0] - expected).abs().max()


def calls_in_one_beam_search(model, task, module):
    """How often ``module`` runs in one beam search (beam 3) over a batch of 2; and the batch."""
    model.eval()
    calls = []
    handle = module.register_forward_hook(lambda *a: calls.append(1))
    src, lengths, _ = random_batch(task.source_dictionary, task.target_dictionary, bsz=2)
    with torch.no_grad():
        beam_search(model, task, src, lengths, beam=3, max_len_b=10)
    handle.remove()
    return len(calls), src, lengths


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



def assert_batch_equals_one_by_one(model, task, src, lengths, beam=4):
    """Beam search on a padded batch gives each sentence's hypotheses and scores exactly as
    searching it alone: catches state that leaks across sentences or is reordered wrongly."""
    with torch.no_grad():
        batched = beam_search(model, task, src, lengths, beam=beam)
        assert len(batched) == src.size(0) and all(len(h) == beam for h in batched)
        for i in range(src.size(0)):
            n = int(lengths[i])
            single = beam_search(model, task, src[i:i + 1, -n:], lengths[i:i + 1], beam=beam)
            for hb, hs in zip(batched[i], single[0]):
                assert torch.equal(hb["tokens"], hs["tokens"])
                assert abs(hb["score"].item() - hs["score"].item()) < 1e-4


def assert_lm_beam_search_scores_equal_full_forward(model, task, prefix, beam=3, max_len_b=10):
    """fairseq's beam search over a language model (``prefix``: B x P forced tokens, B > 1,
    ``beam`` > 1, cached incremental decoding): every hypothesis keeps its prefix and its
    positional scores after the prefix equal one full forward of the hypothesis."""
    from fairseq import search
    from fairseq.sequence_generator import SequenceGenerator

    bsz, length = prefix.shape
    sample = {"net_input": {"src_tokens": prefix, "src_lengths": torch.full((bsz,), length)}}
    gen = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_b=max_len_b,
                            search_strategy=search.BeamSearch(task.target_dictionary))
    with torch.no_grad():
        hypos = gen.generate([model], sample, prefix_tokens=prefix)
    for i, sent in enumerate(hypos):
        assert len(sent) == beam
        for hyp in sent:
            tokens = hyp["tokens"]
            inp = torch.cat([tokens.new_tensor([task.dictionary.eos()]), tokens[:-1]])[None]
            with torch.no_grad():
                lprobs = model.get_normalized_probs(model(inp), log_probs=True)[0]
            scores = lprobs.gather(-1, tokens[:, None])[:, 0]
            torch.testing.assert_close(scores[length:], hyp["positional_scores"][length:],
                                       rtol=1e-4, atol=1e-4)
            assert torch.equal(tokens[:length], prefix[i])


def assert_lm_incremental_equals_full_forward(model, tokens, atol=1e-10):
    """One-token incremental steps of a language model's decoder (B x T ``tokens``) give the
    full forward's outputs (float64 models: to 1e-10 unless ``atol`` says otherwise)."""
    with torch.no_grad():
        full = model(tokens)[0]
        state, steps = {}, []
        for t in range(tokens.size(1)):
            steps.append(model.decoder(tokens[:, :t + 1], incremental_state=state)[0])
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=atol, atol=atol)


def move_connections(model, scale=0.3, seed=2):
    """Every depth-connection parameter (``.depth.`` in its name) moved away from its
    initialisation by ``scale`` times seeded Gaussian noise (dynamic maps no longer zero)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".depth." in name:
                p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


def compile_with_eager_backend(monkeypatch):
    """``--torch-compile`` through dynamo's ``eager`` backend (the tracing as it is, the traced
    graph run unchanged: inductor's code generation takes minutes per model on these CPUs);
    the list of the FX graphs traced."""
    from fairseq_plugins import torch_compile

    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    def compile_module(module, mode):
        torch._dynamo.reset()
        return torch.compile(module, backend=backend)
    monkeypatch.setattr(torch_compile, "compile_module", compile_module)
    return graphs


def cogs_like(root):
    """A COGS-shaped data folder (joined dictionary, test and gen_dev as test / test1) and its
    gen_dev categories, under ``root`` as the preparation script lays them out."""
    from layerlab.prepare import binarize_translation

    text = root / "data" / "cogs"
    text.mkdir(parents=True)
    words = ["a", "b", "c", "d", "e"]
    for subset, n in (("train", 60), ("valid", 12), ("test", 12), ("gen_dev", 12)):
        src = [" ".join(words[(i + k) % 5] for k in range(1 + i % 3)) for i in range(n)]
        (text / f"{subset}.in").write_text("\n".join(src) + "\n")
        (text / f"{subset}.out").write_text("\n".join(s.upper() for s in src) + "\n")
    (text / "gen_dev.cat").write_text("\n".join(["pp_recursion", "subj_to_obj_common"] * 6)
                                      + "\n")
    binarize_translation(str(root / "data-bin" / "cogs"), "in", "out", str(text / "train"),
                         str(text / "valid"), [str(text / "test"), str(text / "gen_dev")],
                         joined=True)


def multi30k_like(root):
    """A Multi30k-shaped data folder under ``root`` as the preparation script lays it out: a
    joined SentencePiece model trained on the toy text (``data/multi30k/spm.model``), the raw
    references (``test.raw.en``) and the binarised de-en pairs (test_2016 and test_2017 as test
    / test1), at a size whose beam search takes seconds, not the real test set's minute."""
    from layerlab.prepare import (binarize_translation, encode_pieces, train_sentencepiece,
                                  write_lines)

    text = root / "data" / "multi30k"
    text.mkdir(parents=True)
    who = [("ein hund", "a dog"), ("eine frau", "a woman"), ("ein kind", "a child"),
           ("ein mann", "a man")]
    does = [("läuft", "runs"), ("spielt", "plays"), ("sitzt", "sits"), ("wartet", "waits")]
    where = [("im park", "in the park"), ("am strand", "on the beach"),
             ("auf der straße", "on the street"), ("im schnee", "in the snow")]
    pairs = [(f"{w[0]} {d[0]} {p[0]} .", f"{w[1]} {d[1]} {p[1]} .")
             for w in who for d in does for p in where]
    pairs = [pairs[(i * 23) % len(pairs)] for i in range(len(pairs))]  # every subset mixed
    raw = {"train": pairs[:40], "valid": pairs[40:48], "test": pairs[48:56],
           "test1": pairs[56:64]}
    sp = train_sentencepiece([s for pair in raw["train"] for s in pair], str(text / "spm"), 40)
    for subset, subset_pairs in raw.items():
        for side, lang in enumerate(("de", "en")):
            lines = [pair[side] for pair in subset_pairs]
            write_lines(str(text / f"{subset}.raw.{lang}"), lines)
            write_lines(str(text / f"{subset}.{lang}"), encode_pieces(sp, lines))
    binarize_translation(str(root / "data-bin" / "multi30k"), "de", "en", str(text / "train"),
                         str(text / "valid"), [str(text / "test"), str(text / "test1")],
                         joined=True)
