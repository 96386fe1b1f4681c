"""fairseq plugins for research on how encoder and decoder layers talk to each other.

Install torch first, then this package without build isolation (fairseq-fixed compiles
extensions against the installed torch): see dev.sh, which does exactly that.
"""
from setuptools import find_packages, setup

setup(
    name="fairseq-layer-plugins",
    version="0.1.0",
    description="fairseq --user-dir plugins: layer-wise fusion, encoder-decoder bridges, "
                "autoregressive encoder-decoder LMs, swapped-role cross-attention",
    packages=find_packages(include=["fairseq_plugins", "fairseq_plugins.*", "layerlab",
                                    "layerlab.*"]),
    package_data={"fairseq_plugins": ["hydra_configs/*.yaml"]},
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
    ],
    extras_require={
        "test": ["pytest", "pytest-xdist"],
        "hf": ["transformers"],
        "data": ["jieba"],  # CoGnition: segmenting the raw Chinese cg-test references
        "plot": ["matplotlib"],
        # fairseq's --tensorboard-logdir writes through torch.utils.tensorboard (tensorboard);
        # its text_to_speech task imports tensorboardX at every start and says so when missing
        "tensorboard": ["tensorboard", "tensorboardX"],
    },
)
