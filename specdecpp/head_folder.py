"""The files a head folder carries besides its weights, so that `transformers`' `generate` runs it.

`custom_generate/generate.py` (`SHIM`) and `custom_generate/requirements.txt`: written by
`AcceptancePredictionHead.save_pretrained` and by `specdecpp push`. This module imports nothing of
the package, so the head can write them without importing the engine (which imports the head).
"""
from __future__ import annotations

import os
from pathlib import Path

# `custom_generate/generate.py` of every head folder: the decoding lives in the package, so a
# published head keeps working as specdecpp improves and the file stays a few lines.
SHIM = '''"""SpecDec++ speculative decoding (https://arxiv.org/abs/2405.19715) with the acceptance prediction
head stored in this folder / Hub repo. Needs the `specdecpp` package (see requirements.txt):

    target.generate(**inputs, assistant_model=draft, custom_generate="<this folder or repo>",
                    trust_remote_code=True, max_new_tokens=128, stop_threshold=0.3, bound=(2, 20))
"""
from specdecpp.custom_generate import generate_from_head


def generate(model, **kwargs):
    """Run SpecDec++ with this folder's head; see `specdecpp.custom_generate.generate_from_head`."""
    return generate_from_head(model, **kwargs)
'''
REQUIREMENTS = "specdecpp\n"
CUSTOM_GENERATE_FILES = {"custom_generate/generate.py": SHIM, "custom_generate/requirements.txt": REQUIREMENTS}


def write_custom_generate(folder: str | os.PathLike) -> list[Path]:
    """Write `custom_generate/generate.py` and `custom_generate/requirements.txt` into `folder` (a
    head folder), making it a `custom_generate` target for `transformers`' `generate`. Returns the
    paths written."""
    written = []
    for name, text in CUSTOM_GENERATE_FILES.items():
        path = Path(folder) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
