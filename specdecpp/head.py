"""The acceptance prediction head: draft hidden state -> P(the target accepts this token).

`k` residual blocks `x + SiLU(Linear(x))` then `Linear(hidden, 2)`; class 1 means accept.
Saved and loaded through `PyTorchModelHubMixin` (`config.json` + `model.safetensors` + a model
card naming the draft, the target, the training data and the eval metrics), so a folder or a Hub
id loads with `AcceptancePredictionHead.from_pretrained` and `push_to_hub` publishes one.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import torch
from huggingface_hub import PyTorchModelHubMixin, constants
from torch import nn


class ResBlock(nn.Module):
    """`x + SiLU(Linear(x))`, the linear zero-initialised so a fresh block is the identity."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


# The model card `save_pretrained`/`push_to_hub` write; filled from `model_card_kwargs` (training
# passes the draft and target names, the data files and the final eval metrics).
MODEL_CARD = """---
{{ card_data }}
---

# Acceptance prediction head (SpecDec++)

Predicts, from the draft model's last-layer hidden state at a drafted token, the probability that
the target model accepts that token. SpecDec++ stops drafting once the predicted probability of
at least one rejection exceeds a threshold ([paper]({{ paper_url }})).

- Draft model (the head reads its hidden states): {{ draft_model | default("not recorded", true) }}
- Target model (whose acceptances it predicts): {{ target_model | default("not recorded", true) }}
- Training data: {{ training_data | default("not recorded", true) }}
{% if stop_threshold is not none %}
## Stop threshold

Stored threshold: {{ stop_threshold }}; `stop_threshold="auto"` uses it.
{% endif %}{% if eval_metrics %}
## Eval metrics

| metric | value |
| --- | --- |
{% for name, value in eval_metrics.items() %}| {{ name }} | {{ value }} |
{% endfor %}{% endif %}{% if calibration %}
## Calibration

| predictions | {{ calibration_columns | join(" | ") }} |
| --- |{% for _ in calibration_columns %} --- |{% endfor %}
{% for name, figures in calibration.items() %}| {{ name }} |{% for column in calibration_columns %} {{ figures.get(column, "") }} |{% endfor %}
{% endfor %}{% for plot in calibration_plots %}
![{{ plot }}]({{ plot }})
{% endfor %}{% endif %}
## Use from transformers

This repository carries `custom_generate/generate.py`, so `generate` runs SpecDec++ with this head
(with the `specdecpp` package installed; `trust_remote_code=True` runs that file):

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
target = AutoModelForCausalLM.from_pretrained("{{ target_model | default("TARGET", true) }}")
draft = AutoModelForCausalLM.from_pretrained("{{ draft_model | default("DRAFT", true) }}")
tokenizer = AutoTokenizer.from_pretrained("{{ target_model | default("TARGET", true) }}")
inputs = tokenizer("def fibonacci(n):", return_tensors="pt")
out = target.generate(**inputs, assistant_model=draft, custom_generate="{{ repo_id | default("this-repo-or-folder", true) }}",
                      trust_remote_code=True, max_new_tokens=128, stop_threshold={{ '"auto"' if stop_threshold is not none else "0.3" }}, bound=(2, 20))
print(tokenizer.decode(out[0]))
```

## Use

With specdecpp directly:

```python
from specdecpp import AcceptancePredictionHead, speculative_generate
head = AcceptancePredictionHead.from_pretrained("{{ repo_id | default("this-repo-or-folder", true) }}")
out = speculative_generate(target, draft, **inputs, head=head, stop_threshold=0.3, bound=(2, 20))
```
"""

class AcceptancePredictionHead(
    nn.Module,
    PyTorchModelHubMixin,
    library_name="specdecpp",
    tags=["speculative-decoding", "specdecpp", "acceptance-prediction-head"],
    paper_url="https://arxiv.org/abs/2405.19715",
    model_card_template=MODEL_CARD,
):
    """Predicts, from the draft's last-layer hidden state at a drafted token, whether the target
    accepts that token. `forward` returns logits over (reject, accept); `accept_prob` the
    probability of class 1. Unlike the reference (which repeated one block `k` times) every
    residual block has its own weights; reference checkpoints still load (see `_load_state_dict`)."""

    def __init__(self, hidden_size: int, num_layers: int = 3):
        super().__init__()
        if hidden_size <= 0 or num_layers < 0:
            raise ValueError(f"hidden_size must be > 0 and num_layers >= 0, got {hidden_size}, {num_layers}")
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.model = nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers)], nn.Linear(hidden_size, 2))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.model(hidden_states.to(self.model[-1].weight.dtype))

    @torch.no_grad()
    def accept_prob(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """P(accept) for each hidden state (`[..., hidden]` -> `[...]`), computed in the head's
        own dtype whatever the draft's, returned as float32."""
        return self(hidden_states).float().softmax(-1)[..., 1]

    # -- loading: accept the reference's shared-block layout as well as ours ---------------------
    def _load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load strictly, first filling in residual blocks a reference checkpoint left out: its
        blocks were one shared module, so a file may hold only `model.0.linear.*`."""
        state_dict = dict(state_dict)
        blocks = {int(m.group(1)) for k in state_dict if (m := re.match(r"model\.(\d+)\.linear\.", k))}
        if blocks and blocks != set(range(self.num_layers)) and blocks <= set(range(self.num_layers)):
            source = min(blocks)
            for i in range(self.num_layers):
                for name in ("weight", "bias"):
                    state_dict.setdefault(f"model.{i}.linear.{name}", state_dict[f"model.{source}.linear.{name}"])
        self.load_state_dict(state_dict, strict=True)

    @classmethod
    def _from_pretrained(cls, *, model_id: str, map_location: str = "cpu", strict: bool = False, **kwargs):
        """Also load a local folder that holds only `pytorch_model.bin`, as older huggingface_hub
        versions (the reference's) saved; the mixin looks for that file on the Hub only."""
        folder = str(model_id)
        pickle_file = os.path.join(folder, constants.PYTORCH_WEIGHTS_NAME)
        if (os.path.isdir(folder) and os.path.isfile(pickle_file)
                and not os.path.isfile(os.path.join(folder, constants.SAFETENSORS_SINGLE_FILE))):
            hub_options = ("revision", "cache_dir", "force_download", "local_files_only", "token")
            model = cls(**{k: v for k, v in kwargs.items() if k not in hub_options})
            return cls._load_as_pickle(model, pickle_file, map_location, strict)
        return super()._from_pretrained(model_id=model_id, map_location=map_location, strict=strict, **kwargs)

    @classmethod
    def _load_as_safetensor(cls, model, model_file: str, map_location: str, strict: bool):
        from safetensors.torch import load_file

        model._load_state_dict(load_file(model_file, device=str(map_location)))
        return model.eval()

    @classmethod
    def _load_as_pickle(cls, model, model_file: str, map_location: str, strict: bool):
        model._load_state_dict(torch.load(model_file, map_location=torch.device(map_location), weights_only=True))
        return model.eval()

    # -- custom_generate and the model card: a saved folder runs from transformers' generate ----------
    def _save_pretrained(self, save_directory: Path) -> None:
        """Save the weights (the mixin's way), then `custom_generate/generate.py` and
        `custom_generate/requirements.txt`, so `generate(custom_generate=FOLDER)` runs SpecDec++."""
        super()._save_pretrained(save_directory)
        from specdecpp.custom_generate import write_custom_generate  # that module imports this one

        write_custom_generate(save_directory)

    def generate_model_card(self, *args, **kwargs):
        """The model card, with the stored stop threshold (config key `stop_threshold`, when the
        config has one) unless the caller gives one, and empty calibration columns filled in."""
        config = getattr(self, "config", None)
        config = config if isinstance(config, dict) else getattr(self, "_hub_mixin_config", None) or {}
        kwargs.setdefault("stop_threshold", config.get("stop_threshold") if isinstance(config, dict) else None)
        calibration = kwargs.get("calibration") or {}
        columns = kwargs.get("calibration_columns") or list(dict.fromkeys(k for f in calibration.values() for k in f))
        kwargs.update(calibration_columns=columns, calibration_plots=kwargs.get("calibration_plots") or [])
        return super().generate_model_card(*args, **kwargs)
