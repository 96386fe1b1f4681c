"""fairseq plugins for research on how encoder and decoder layers talk to each other.

Install torch first, then this package without build isolation (fairseq-fixed compiles
extensions against the installed torch): see dev.sh, which does exactly that.
"""
import os

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

try:  # setuptools >= 64 (PEP 660 editable installs); older ones install the .pth by build_py
    from setuptools.command.editable_wheel import editable_wheel
except ImportError:  # pragma: no cover
    editable_wheel = None

# fairseq_plugins_hints.py explains two mistakes made before --user-dir imports the package; this
# file, installed beside the packages, imports it when the interpreter starts
HINTS_PTH = "fairseq_plugins_hints.pth"


class BuildPyWithHints(build_py):
    """A wheel (pip install .) carries the .pth at its root, beside the packages."""

    def run(self):
        super().run()
        self.copy_file(HINTS_PTH, os.path.join(self.build_lib, HINTS_PTH))

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, HINTS_PTH)]


COMMANDS = {"build_py": BuildPyWithHints}
if editable_wheel is not None:
    class EditableWheelWithHints(editable_wheel):
        """An editable install (pip install -e ., what dev.sh does) writes only its own finder
        into the wheel; the namespace step is the one that writes files at the wheel's root."""

        def _install_namespaces(self, installation_dir, pth_prefix):
            super()._install_namespaces(installation_dir, pth_prefix)
            self.copy_file(HINTS_PTH, os.path.join(installation_dir, HINTS_PTH))

    COMMANDS["editable_wheel"] = EditableWheelWithHints


setup(
    name="fairseq-layer-plugins",
    version="0.1.0",
    description="fairseq --user-dir plugins: layer-wise fusion, encoder-decoder bridges, "
                "autoregressive encoder-decoder LMs, swapped-role cross-attention",
    packages=find_packages(include=["fairseq_plugins", "fairseq_plugins.*", "layerlab",
                                    "layerlab.*"]),
    py_modules=["fairseq_plugins_hints"],
    package_data={"fairseq_plugins": ["hydra_configs/*.yaml"]},
    cmdclass=COMMANDS,
    python_requires=">=3.8",
    install_requires=[
        "torch",
        # official fairseq 0.12.2 does not import on Python 3.11; fairseq-fixed is main + that fix
        'fairseq-fixed==0.12.3.1; python_version >= "3.11"',
        'fairseq>=0.12.2; python_version < "3.11"',
        "numpy",
        "sacrebleu>=2.0",
        # pinned: the committed WikiText-2 comparison runs (results/lm_depth_runs) were made
        # with the vocabulary this version trains; another version may train other pieces, and
        # the comparison then refuses the data (its dictionary's digest differs)
        "sentencepiece==0.2.3",
        "subword-nmt",
        # the experiment runner's launchers (layerlab.runner: this machine or Slurm)
        "submitit",
    ],
    extras_require={
        # triton: the depth connections' GPU kernels, tested on CPU under its interpreter (the
        # version torch 2.13's CUDA wheels pin; torch's CPU wheels ship none)
        # filelock (torch needs it too): data the test workers share is made once (conftest)
        "test": ["pytest", "pytest-xdist", "filelock",
                 'triton==3.7.1; platform_system == "Linux"'],
        "hf": ["transformers"],
        "data": ["jieba"],  # CoGnition: segmenting the raw Chinese cg-test references
        "plot": ["matplotlib"],
        # fairseq's --tensorboard-logdir writes through torch.utils.tensorboard (tensorboard);
        # its text_to_speech task imports tensorboardX at every start and says so when missing
        "tensorboard": ["tensorboard", "tensorboardX"],
    },
)
