"""Install script for ``encoding``: a pure-Python semantic-segmentation toolkit for PyTorch."""
import os

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def read_version() -> str:
    """Read ``__version__`` from ``encoding/version.py`` without importing torch."""
    scope: dict = {}
    with open(os.path.join(HERE, "encoding", "version.py"), encoding="utf-8") as f:
        exec(f.read(), scope)
    return scope["__version__"]


setup(
    name="encoding",
    version=read_version(),
    description="Balanced multi-GPU semantic segmentation for PyTorch (PyTorch-Encoding compatible, pure Python)",
    long_description=open(os.path.join(HERE, "README.md"), encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.9",
    packages=find_packages(include=["encoding", "encoding.*"]),
    # the dataset recipes (encoding.config.RECIPE_DIR): resolve() and train.py read them from the installed package
    package_data={"encoding.config": ["recipe_files/*.yaml"]},
    install_requires=[
        "torch>=2.2",
        "torchvision>=0.17",
        "pillow",
        "tqdm",
        "numpy",
    ],
    extras_require={
        # the suite also builds the documentation (tests/test_docs.py), hence the docs packages
        # and runs every optional integration against the real library (timm backbones, SegFormer against
        # transformers, ONNX export under onnxruntime, YAML configs, TensorBoard / W&B logs, losses against smp,
        # the web page of python -m encoding.app; its browser test also needs Debian's chromium + chromium-driver)
        "test": ["pytest", "pytest-xdist", "matplotlib", "scipy", "pycocotools", "sphinx", "myst-parser", "furo",
                 "timm", "transformers", "onnx", "onnxruntime", "onnxscript", "pyyaml", "tensorboard", "wandb",
                 "segmentation-models-pytorch", "huggingface_hub", "safetensors",
                 "gradio", "gradio_client", "selenium"],  # the web page, driven by its client and in Chromium
        # `python -m sphinx -W -b html docs docs/_build/html`
        "docs": ["sphinx", "myst-parser", "furo"],
        "chart": ["matplotlib"],  # scripts/memory_balance.py --chart, training curves
        "timm": ["timm"],  # backbone="timm:<name>", the ResNeSt backbones
        "config": ["pyyaml"],  # train.py --config FILE.yaml
        "monitor": ["tensorboard", "matplotlib"],  # train.py --tensorboard, the curve plot (--wandb: pip install wandb)
        "export": ["onnx", "onnxruntime", "onnxscript"],  # python -m encoding.export --format onnx
        # save_pretrained / load_model("user/repo") / push_to_hub: whole models as safetensors on the Hugging Face Hub
        "hub": ["huggingface_hub", "safetensors"],
        # only for `python -m encoding.datasets.prepare`: SBD's .mat labels, PASCAL-Context RLE, COCO masks
        "prepare": ["scipy", "pycocotools"],
        # python -m encoding.app: the web page (Segment, Plan memory; its chart needs matplotlib)
        "app": ["gradio", "gradio_client", "matplotlib"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
