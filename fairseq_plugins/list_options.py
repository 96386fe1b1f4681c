"""``python -m fairseq_plugins.list_options ARCH``: every option of one of the package's
architectures, with the value that architecture gives it.

``fairseq-train --arch ARCH --help`` cannot list them: fairseq adds a model's options to its
parser after a first parse, and argparse answers ``--help`` in that first parse (fairseq's own
architectures are listed the same way: without their options). This prints the options as
``fairseq-train`` spells them; under ``fairseq-hydra-train`` each is ``model.<name>`` with
underscores (docs/hydra.md).
"""
import argparse
import sys

PROG = "python -m fairseq_plugins.list_options"


def options_parser(arch: str) -> argparse.ArgumentParser:
    """A parser holding ``arch``'s model options, each help ending with the value ``arch`` gives
    it when nothing else is given (its preset's, else the model's default)."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    model = ARCH_MODEL_REGISTRY[arch]
    resolved = vars(model.resolved_options(argparse.Namespace(arch=arch)))
    parser = argparse.ArgumentParser(prog=f"fairseq-train --arch {arch}", add_help=False,
                                     usage=argparse.SUPPRESS)
    group = parser.add_argument_group(f"options of {arch} (fairseq-hydra-train: model.<name>)")
    model.add_args(group)
    for action in group._group_actions:
        value = resolved.get(action.dest)
        if value is not None:
            shown = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value
            action.help = f"{action.help or ''} [{arch}: {shown}]".replace("%", "%%")
    return parser


def main(argv=None):
    from . import registry  # noqa: F401  (importing the package registers its models)
    from fairseq.models import ARCH_MODEL_REGISTRY

    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("arch", help="an architecture of this package (--arch)")
    args = parser.parse_args(argv)
    ours = sorted(arch for arch, model in ARCH_MODEL_REGISTRY.items()
                  if model.__module__.startswith(__package__ + "."))
    if args.arch not in ours:
        parser.error(f"{args.arch!r} is not an architecture of this package; its architectures: "
                     f"{', '.join(ours)}")
    options_parser(args.arch).print_help(sys.stdout)


if __name__ == "__main__":
    main()
