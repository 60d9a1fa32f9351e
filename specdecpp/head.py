"""The acceptance prediction head: draft state -> P(the target accepts the judged token).

`k` residual blocks `x + SiLU(Linear(x))` then `Linear(width, 2)`; class 1 means accept.
Which draft state judges which drafted token is the head's `alignment` (docs/design.md, The two alignments):
- `proposer`: the forward pass that proposes `y_j` judges it, from the draft's last-layer hidden
  state there plus `features` of the same logits (`logit_features`: log q(y_j), the entropy of q);
- `reader` (the reference's, and every config without the key): the state that has read `y_j`
  judges it, one draft step later.
Saved and loaded through `PyTorchModelHubMixin` (`config.json` + `model.safetensors` + the model
card and `custom_generate/` that `specdecpp.head_folder` writes), so a folder or a Hub
id loads with `AcceptancePredictionHead.from_pretrained` and `push_to_hub` publishes one.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import torch
from huggingface_hub import ModelCard, PyTorchModelHubMixin, constants
from torch import nn



ALIGNMENTS = ("proposer", "reader")


def _log_q(log_probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    # clamped so that a token the draft rules out (-inf) stays a finite input
    return log_probs.gather(-1, tokens[..., None])[..., 0].clamp_min(-50.0)


def _entropy(log_probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return -(log_probs.exp() * log_probs.clamp_min(-1e4)).sum(-1)


def _margin(log_probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    # log q(y) - the best other token's log q: top-1 minus top-2 for a greedy proposal, negative
    # for a sampled token that is not the draft's top one; clamped like log q
    top2 = log_probs.topk(2, dim=-1)
    best_other = torch.where(top2.indices[..., 0] == tokens, top2.values[..., 1], top2.values[..., 0])
    return (_log_q(log_probs, tokens) - best_other.clamp_min(-50.0)).clamp(-50.0, 50.0)


def _log_rank(log_probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    # log(1 + the number of tokens the draft rates higher): 0 for its top token; a sampled token far
    # down the draft's list is one the target rarely rates as highly (sampling's rejections)
    higher = (log_probs > log_probs.gather(-1, tokens[..., None])).sum(-1)
    return torch.log1p(higher.to(log_probs.dtype))


# Features of the judged token under the logits that proposed it: name -> f(log_probs, tokens).
FEATURES = {"log_q": _log_q, "entropy": _entropy, "margin": _margin, "log_rank": _log_rank}


def logit_features(logits: torch.Tensor, tokens: torch.Tensor, names: list[str]) -> torch.Tensor:
    """The named features (`FEATURES`) of `tokens` `[...]` under the draft's raw `logits`
    `[..., vocab]` (temperature 1, no filtering, so greedy and sampled decoding, training and the
    engine all see the same values), as float32 `[..., len(names)]`."""
    log_probs = logits.float().log_softmax(-1)
    return torch.stack([FEATURES[name](log_probs, tokens) for name in names], dim=-1)


def step_features(logits: torch.Tensor, probs: torch.Tensor | None, token: int, names: list[str],
                  q_token: float | None = None) -> list[float]:
    """`logit_features` of one drafted `token` from the softmax its draft step already computed,
    as Python floats: `logits` `[vocab]` are the draft's raw logits (float32 or wider) and `probs`
    their softmax at temperature 1 without filtering (None when the step's distribution was warped;
    it is then computed here; `q_token`, `probs[token]` when the step already read it). No log-softmax over the vocabulary: log q(y) is the log of one
    probability, and the entropy is `log Z - sum(q * logits)`, with `log Z = logit(a) - log q(a)`
    read at a token `a` of high probability; logits the draft rules out (-inf) take the exact path."""
    if probs is None:
        probs, q_token = logits.softmax(-1), None
    if q_token is None:
        q_token = float(probs[token])
    values = {}
    if "log_q" in names:
        values["log_q"] = max(math.log(q_token), -50.0) if q_token > 0.0 else -50.0  # as `_log_q` clamps
    if "entropy" in names:
        anchor = token if q_token > 1e-6 else int(probs.argmax())  # log Z from a well-resolved probability
        q_anchor = q_token if anchor == token else float(probs[anchor])
        entropy = float(logits[anchor]) - math.log(q_anchor) - float(torch.dot(probs, logits))
        if not math.isfinite(entropy):  # -inf logits: 0 * -inf in the dot product
            entropy = float(_entropy(logits.log_softmax(-1), None))
        values["entropy"] = entropy
    if "margin" in names:  # from the raw logits: a difference of log-probabilities is one of logits
        top2 = logits.topk(2)
        best_other = top2.values[1] if int(top2.indices[0]) == token else top2.values[0]
        values["margin"] = min(max(float(logits[token] - best_other), -50.0), 50.0)
    if "log_rank" in names:  # ties as `_log_rank` counts them: strictly higher logits only
        values["log_rank"] = math.log1p(int((logits > logits[token]).sum()))
    return [values[name] for name in names]


class LeanJudge:
    """A head's `accept_prob` for one draft state at a time, as the decode loop calls it once per
    draft step: the same arithmetic on the head's own weight tensors (no module calls, no autograd,
    the two output logits folded into one difference), returning a Python float. It shares the
    head's weights, so it must be rebuilt after the head's weights are replaced."""

    def __init__(self, head: "AcceptancePredictionHead"):
        output = head.model[-1]
        self.blocks = [(block.linear.weight.detach(), block.linear.bias.detach()) for block in head.model[:-1]]
        self.out_weight = (output.weight[1] - output.weight[0]).detach()
        self.out_bias = float(output.bias[1].detach() - output.bias[0].detach())
        self.dtype, self.device = output.weight.dtype, output.weight.device
        self.num_features = len(head.features)
        self.reads_hidden_states = head.reads_hidden_states

    def __call__(self, hidden: torch.Tensor | None, features: list[float] = ()) -> float:
        """P(accept) from one hidden state `[hidden]` (None for a head of features alone) and the
        judged token's feature values."""
        # Detached weights and a state without grad: nothing for autograd to record.
        values = torch.tensor(features, dtype=self.dtype, device=self.device) if self.num_features else None
        if not self.reads_hidden_states:
            x = values
        else:
            x = hidden.to(self.device, self.dtype)
            if self.num_features:
                x = torch.cat((x, values))
        for weight, bias in self.blocks:
            x = x + torch.nn.functional.silu(torch.addmv(bias, weight, x), inplace=True)
        logit = float(torch.dot(self.out_weight, x)) + self.out_bias
        return 1.0 / (1.0 + math.exp(-logit)) if logit > -700 else 0.0


class ResBlock(nn.Module):
    """`x + SiLU(Linear(x))`, the linear zero-initialised so a fresh block is the identity."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


# What the Hub shows for the class (the mixin's card data), and the card `head_folder` renders.
LIBRARY_NAME = "specdecpp"
TAGS = ["speculative-decoding", "specdecpp", "acceptance-prediction-head"]
PAPER_URL = "https://arxiv.org/abs/2405.19715"


class AcceptancePredictionHead(
    nn.Module,
    PyTorchModelHubMixin,
    library_name=LIBRARY_NAME,
    tags=TAGS,
    paper_url=PAPER_URL,
):
    """Predicts, from a draft state (and, for a `proposer` head, features of the judged token),
    whether the target accepts the judged token. `forward` returns logits over (reject, accept);
    `accept_prob` the probability of class 1. Takes keyword arguments or the reference's config
    dict; a config without `alignment` is a `reader` head. Unlike the reference (which repeated one
    block `k` times) every residual block has its own weights; reference checkpoints still load
    (see `_load_state_dict`) with identical outputs."""

    def __init__(self, hidden_size: int | dict, num_layers: int = 3, alignment: str = "reader",
                 features: list[str] | None = None, stop_threshold: float | None = None,
                 threshold_selection: dict | None = None):
        super().__init__()
        if isinstance(hidden_size, dict):  # the reference's call: AcceptancePredictionHead(config_dict)
            config = dict(hidden_size)
            hidden_size, num_layers = config.pop("hidden_size"), config.pop("num_layers", num_layers)
            alignment = config.pop("alignment", alignment)
            features = config.pop("features", features)
            stop_threshold = config.pop("stop_threshold", stop_threshold)
            threshold_selection = config.pop("threshold_selection", threshold_selection)
        features = list(features or [])
        if hidden_size < 0 or num_layers < 0:
            raise ValueError(f"hidden_size and num_layers must be >= 0, got {hidden_size}, {num_layers}")
        if hidden_size == 0 and not features:
            raise ValueError("a head that reads no hidden state (hidden_size=0) needs logit features")
        if alignment not in ALIGNMENTS:
            raise ValueError(f"alignment must be one of {', '.join(ALIGNMENTS)}, got {alignment!r}")
        if unknown := [name for name in features if name not in FEATURES]:
            raise ValueError(f"unknown head features {unknown}; choose from {', '.join(FEATURES)}")
        if features and alignment != "proposer":
            raise ValueError("logit features describe the token a state proposes: they need alignment='proposer'")
        if stop_threshold is not None and not 0.0 <= stop_threshold <= 1.0:
            raise ValueError(f"stop_threshold must lie in [0, 1], got {stop_threshold}")
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.alignment = alignment
        self.features = features
        self.stop_threshold = stop_threshold
        self.threshold_selection = threshold_selection
        width = hidden_size + len(features)
        self.model = nn.Sequential(*[ResBlock(width) for _ in range(num_layers)], nn.Linear(width, 2))
        self._hub_mixin_config = self.config  # what save_pretrained writes to config.json

    @property
    def config(self) -> dict:
        """The head's config as saved in `config.json`: shape, alignment, features and, once
        chosen (`specdecpp.calibration --choose_threshold`), the stored threshold and how it was chosen."""
        config = {"hidden_size": self.hidden_size, "num_layers": self.num_layers, "alignment": self.alignment}
        if self.features:
            config["features"] = list(self.features)
        if self.stop_threshold is not None:
            config["stop_threshold"] = self.stop_threshold
            config["threshold_selection"] = self.threshold_selection
        return config

    def with_threshold(self, stop_threshold: float, threshold_selection: dict) -> AcceptancePredictionHead:
        """This head (same weights) with a stored threshold and the record of how it was chosen."""
        self.stop_threshold, self.threshold_selection = stop_threshold, threshold_selection
        self._hub_mixin_config = self.config
        return self

    @property
    def threshold_mode(self) -> str | None:
        """`"greedy"` or `"sampling"`: the decoding mode of the records the stored threshold was
        chosen on (selections that predate the field were greedy), or None without one."""
        if self.stop_threshold is None:
            return None
        return (self.threshold_selection or {}).get("mode", "greedy")

    @property
    def threshold_processing(self) -> dict:
        """The logits processing (`DecodingSettings.processing()`) of the records the stored threshold
        was chosen on: `{}` for none (and for selections that predate the field)."""
        return (self.threshold_selection or {}).get("processing", {})

    def resolve_stop_threshold(self, stop_threshold: float | str) -> float:
        """`stop_threshold` itself, or for `"auto"` the threshold stored in this head (ValueError
        when none is stored)."""
        if stop_threshold != "auto":
            return float(stop_threshold)
        if self.stop_threshold is None:
            raise ValueError("stop_threshold='auto' needs a head with a stored threshold, and this one has none: "
                             "choose one with `python -m specdecpp.calibration ... --choose_threshold` "
                             "or pass a number")
        return self.stop_threshold

    @property
    def reads_hidden_states(self) -> bool:
        """Whether the head reads the draft's hidden state (`hidden_size > 0`); a head of logit
        features alone (`hidden_size = 0`) fits any draft."""
        return self.hidden_size > 0

    def forward(self, hidden_states: torch.Tensor | None, features: torch.Tensor | None = None) -> torch.Tensor:
        """Logits over (reject, accept) from hidden states `[..., hidden]` (ignored, and may be None,
        for a head of features alone) and, for a head with features, the matching
        `[..., len(features)]` values (see `logit_features`)."""
        dtype = self.model[-1].weight.dtype
        if not self.features:
            return self.model(hidden_states.to(dtype))
        if features is None:
            raise ValueError(f"this head also reads the features {self.features} of the judged token")
        if not self.reads_hidden_states:
            return self.model(features.to(dtype))
        return self.model(torch.cat([hidden_states.to(dtype), features.to(dtype)], dim=-1))

    @torch.no_grad()
    def accept_prob(self, hidden_states: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
        """P(accept) for each hidden state (`[..., hidden]` -> `[...]`), computed in the head's
        own dtype whatever the draft's, returned as float32."""
        return self(hidden_states, features).float().softmax(-1)[..., 1]

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
    # The folder's other files are `specdecpp.head_folder`'s, which renders the card with the cost
    # model; it is imported where a folder is written, so that the module (what the engine loads)
    # stands on neither.
    def save_pretrained(self, save_directory: str | Path, *, model_card_kwargs: dict | None = None, **kwargs):
        """The mixin's `save_pretrained` (and `push_to_hub`, which calls it); `model_card_kwargs`, the
        card's facts (`draft`, `target`, `training_data`, `eval_metrics`, see `head_folder`), are
        kept in the folder's `card.json`, so that the card renders from the folder alone, now and later."""
        from specdecpp.head_folder import record_card_facts

        if model_card_kwargs:
            record_card_facts(save_directory, model_card_kwargs)
        return super().save_pretrained(save_directory, model_card_kwargs=model_card_kwargs, **kwargs)

    def _save_pretrained(self, save_directory: Path) -> None:
        """Save the weights (the mixin's way) and `config.json` (now, so that the card renders from
        it; the mixin then keeps it), then `custom_generate/` and the model card rendered from the
        folder (`head_folder.write_head_files`), so `generate(custom_generate=FOLDER)` runs SpecDec++."""
        from specdecpp.head_folder import write_head_files

        super()._save_pretrained(save_directory)
        (Path(save_directory) / constants.CONFIG_NAME).write_text(json.dumps(self.config, sort_keys=True, indent=2))
        write_head_files(save_directory)

    def generate_model_card(self, *args, **kwargs) -> ModelCard:
        """The model card of this head's config with the facts `kwargs` (see `head_folder.render_card`)."""
        from specdecpp.head_folder import render_card

        return ModelCard(render_card(self.config, kwargs))
