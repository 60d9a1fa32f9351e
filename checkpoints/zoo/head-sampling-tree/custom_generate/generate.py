"""SpecDec++ speculative decoding (https://arxiv.org/abs/2405.19715) with the acceptance prediction
head stored in this folder / Hub repo. Needs the `specdecpp` package (see requirements.txt):

    target.generate(**inputs, assistant_model=draft, custom_generate="<this folder or repo>",
                    trust_remote_code=True, max_new_tokens=128)
"""
from specdecpp.custom_generate import generate_from_head


def generate(model, **kwargs):
    """Run SpecDec++ with this folder's head; see `specdecpp.custom_generate.generate_from_head`."""
    return generate_from_head(model, **kwargs)
