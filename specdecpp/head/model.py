"""The acceptance prediction head: a draft state (and, for a proposer head, features of the judged token) -> P(the
target accepts that token). Residual blocks then a 2-way output layer; the alignments are docs/design.md's."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch
from huggingface_hub import ModelCard, PyTorchModelHubMixin, constants
from torch import nn
from torch.compiler import is_dynamo_compiling

from specdecpp.head.card_data import LIBRARY_NAME, PAPER_URL, TAGS

ALIGNMENTS = ("proposer", "reader")

# The features a head may read of the token it judges (`logit_features`).
FEATURES = ("log_q", "entropy", "margin", "log_rank", "log_left")

Linear = tuple[torch.Tensor, torch.Tensor]  # a layer's (weight, bias)


def logit_features(logits: torch.Tensor, tokens: torch.Tensor, names: list[str], probs: torch.Tensor | None = None,
                   taken: torch.Tensor | None = None) -> torch.Tensor:
    """The named `FEATURES` of `tokens` under the draft's raw `logits` (`probs`: their softmax, when computed),
    float32 `[..., len(names)]`: the one code of the head's features for training and every draft step. `taken`
    (`[...]`) is the draft's mass of the siblings drawn before each token (None: none, as for a chain's token)."""
    logits = logits.float()
    probs = logits.softmax(-1) if probs is None else probs.float()
    index = tokens[..., None]
    token_logit, columns = logits.gather(-1, index), []
    for name in names:
        if name == "log_q":  # clamped so that a token the draft rules out (-inf) stays a finite input
            column = probs.gather(-1, index).log().clamp_min(-50.0)
        elif name == "entropy":
            # log Z - E_q[logit], log Z read at the top token; ruled-out logits (0 * -inf) add nothing.
            log_z = logits.amax(-1, keepdim=True) - probs.amax(-1, keepdim=True).log()
            column = log_z - (probs * logits).nansum(-1, keepdim=True)
        elif name == "margin":  # a difference of log-probabilities is one of logits
            best_other = logits.scatter(-1, index, float("-inf")).amax(-1, keepdim=True)
            column = (token_logit - best_other).clamp(-50.0, 50.0)
        elif name == "log_rank":  # ties count as not higher: 0 for the top token
            column = (logits > token_logit).sum(-1, keepdim=True).to(logits.dtype).log1p()
        elif name == "log_left":  # the draft's mass left to draw from once the earlier siblings were drawn
            column = torch.zeros_like(token_logit) if taken is None \
                else (1.0 - taken.float()[..., None]).clamp_min(1e-20).log().clamp_min(-50.0)
        else:
            raise ValueError(f"unknown head feature {name!r}; choose from {', '.join(FEATURES)}")
        columns.append(column)
    return torch.cat(columns, -1)


def head_logits(hidden: torch.Tensor | None, features: torch.Tensor | None, projection: Linear | None,
                blocks: list[Linear], output: Linear) -> torch.Tensor:
    """A head's logits over (reject, accept) from hidden states and/or features (or None) and its weight tensors."""
    return torch.nn.functional.linear(head_state(hidden, features, projection, blocks, output[0]), *output)


def head_state(hidden: torch.Tensor | None, features: torch.Tensor | None, projection: Linear | None,
               blocks: list[Linear], like: torch.Tensor) -> torch.Tensor:
    """What a head's output layer reads: its inputs, as `like`, through its `projection` (if any) and `blocks`."""
    x = head_input(hidden, features, like)
    if projection is not None:
        x = torch.nn.functional.linear(x, *projection)
    for block_weight, block_bias in blocks:
        x = residual_block(x, block_weight, block_bias)
    return x


def head_input(hidden: torch.Tensor | None, features: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """A head's input: the hidden states and/or features given (not None), joined, on `like`'s device and dtype (the
    tensors given where they already are, never copied)."""
    if hidden is None or features is None:
        state = features if hidden is None else hidden
        return state if state.dtype == like.dtype and state.device == like.device else state.to(like.device, like.dtype)
    return torch.cat([hidden.to(like.device, like.dtype), features.to(like.device, like.dtype)], dim=-1)


silu_ = torch._C._nn.silu_  # `F.silu(x, inplace=True)`'s kernel, called without its Python wrapper


def residual_block(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """`x + SiLU(x W^T + b)`: one residual block of a head."""
    return x + torch.nn.functional.silu(torch.nn.functional.linear(x, weight, bias))


class LeanJudge:
    """A head's judgement of drafted tokens as every draft step makes it, without a host sync: the head's weights on
    `device`, each layer's transposed (`x @ W^T` reads them in place), as views of one tensor, `weights`, a compiled
    graph's one input for them. Its states are its own, updated in place; the inputs it is given are left as they
    were."""

    def __init__(self, head: AcceptancePredictionHead, device: torch.device | str | None = None):
        weight, bias = head.output()  # softmax over (reject, accept): the sigmoid of their difference
        projection = [head.input_projection()] if head.width else []
        tensors = [t.detach() for layer_weight, layer_bias in [*projection, *head.blocks()]
                   for t in (layer_weight.t(), layer_bias)] + [(weight[1] - weight[0]).detach(), (bias[1] - bias[0]).detach()]
        self.shapes = [t.shape for t in tensors]
        self.weights = torch.cat([t.reshape(-1) for t in tensors]).to(device)
        self.features, self.reads_hidden_states, self.projects = head.features, head.reads_hidden_states, bool(head.width)
        self.layers = self._unpacked()

    def _unpacked(self) -> tuple[Linear | None, list[Linear], torch.Tensor, torch.Tensor]:
        """`weights` as views: (the projection or None, the blocks, each as `(W^T, b)`, the accept weight and bias)."""
        *tensors, accept_weight, accept_bias = [part.view(shape) for part, shape in zip(
            self.weights.split([s.numel() for s in self.shapes]), self.shapes)]
        layers = list(zip(tensors[0::2], tensors[1::2]))
        projection = layers.pop(0) if self.projects else None
        return projection, layers, accept_weight, accept_bias

    def load(self, head: AcceptancePredictionHead) -> None:
        """Copy `head`'s weights (of this judge's shapes) into `weights`, in place."""
        self.weights.copy_(LeanJudge(head, self.weights.device).weights)

    def __call__(self, hidden: torch.Tensor | None, logits: torch.Tensor, token: torch.Tensor,
                 probs: torch.Tensor | None = None, taken: torch.Tensor | None = None) -> torch.Tensor:
        """P(accept) (float32) of `token` drafted from raw `logits` (`probs`: their softmax, if any) at `hidden`,
        after siblings of draft mass `taken` (`logit_features`): `head_logits`' arithmetic."""
        # Traced by dynamo, the views are taken in the graph, so that it reads `weights` alone.
        projection, blocks, accept_weight, accept_bias = self._unpacked() if is_dynamo_compiling() else self.layers
        features = logit_features(logits, token, self.features, probs, taken) if self.features else None
        state = head_input(hidden if self.reads_hidden_states else None, features, accept_weight)
        owned = projection is not None  # whether `state` is the judge's own, to update in place, or its input
        if owned:
            state = (state @ projection[0]).add_(projection[1])
        for transposed, bias in blocks:
            update = silu_((state @ transposed).add_(bias))
            state, owned = state.add_(update) if owned else state + update, True
        logit = (state @ accept_weight).add_(accept_bias)
        return (logit if logit.dtype == torch.float32 else logit.float()).sigmoid_()


class ResBlock(nn.Module):
    """`x + SiLU(Linear(x))`, the linear zero-initialised so a fresh block is the identity."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return residual_block(x, self.linear.weight, self.linear.bias)


class AcceptancePredictionHead(nn.Module, PyTorchModelHubMixin, library_name=LIBRARY_NAME, tags=TAGS,
                               paper_url=PAPER_URL):
    """Predicts whether the target accepts the judged token (`forward`: logits over (reject, accept)); takes keyword
    arguments or the reference's config dict (no `alignment`: a reader) and loads the reference's checkpoints."""

    def __init__(self, hidden_size: int | dict, num_layers: int = 3, alignment: str = "reader",
                 features: list[str] | None = None, stop_threshold: float | None = None,
                 threshold_selection: dict | None = None, width: int | None = None):
        super().__init__()
        if isinstance(hidden_size, dict):  # the reference's call: AcceptancePredictionHead(config_dict)
            config = hidden_size
            hidden_size, num_layers = config["hidden_size"], config.get("num_layers", num_layers)
            alignment, features = config.get("alignment", alignment), config.get("features", features)
            stop_threshold, width = config.get("stop_threshold", stop_threshold), config.get("width", width)
            threshold_selection = config.get("threshold_selection", threshold_selection)
        features = list(features or [])
        if hidden_size < 0 or num_layers < 0 or (width is not None and width < 1):
            raise ValueError(f"need hidden_size and num_layers >= 0 and width >= 1 (or None), got {hidden_size}, "
                             f"{num_layers}, {width}")
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
        self.hidden_size, self.num_layers, self.alignment, self.features = hidden_size, num_layers, alignment, features
        self.stop_threshold, self.threshold_selection, self.width = stop_threshold, threshold_selection, width
        if width is not None:  # the inputs projected to the blocks' width: fewer weights to read
            self.projection = nn.Linear(hidden_size + len(features), width)
        width = width or hidden_size + len(features)
        self.model = nn.Sequential(*[ResBlock(width) for _ in range(num_layers)], nn.Linear(width, 2))
        self._hub_mixin_config = self.config  # what save_pretrained writes to config.json

    @property
    def config(self) -> dict:
        """The head's `config.json`: shape, alignment, features and any stored threshold selection."""
        config = {"hidden_size": self.hidden_size, "num_layers": self.num_layers, "alignment": self.alignment}
        if self.width is not None:
            config["width"] = self.width
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
        """The decoding mode (`greedy` or `sampling`) the stored threshold was chosen in, or None without one."""
        return None if self.stop_threshold is None else (self.threshold_selection or {}).get("mode", "greedy")

    @property
    def threshold_processing(self) -> dict:
        """The logits processing the stored threshold was chosen under (`{}` for none)."""
        return (self.threshold_selection or {}).get("processing", {})

    def resolve_stop_threshold(self, stop_threshold: float | str, step_times=None) -> float:
        """`stop_threshold`, or for `auto` the stored one (chosen again for `step_times`); ValueError without one."""
        if stop_threshold != "auto":
            return float(stop_threshold)
        if self.stop_threshold is None:
            raise ValueError("stop_threshold='auto' needs a head with a stored threshold, and this one has none: "
                             "choose one with `python -m specdecpp.calibration.report ... --choose_threshold` "
                             "or pass a number")
        return self.stop_threshold if step_times is None else self.threshold_for(step_times)

    def threshold_for(self, step_times, unit_ms: float | None = None) -> float:
        """The calibration's threshold grid's cheapest at `step_times` (`ada`'s judged steps where it will decode),
        pricing the rounds it replayed at each threshold in target-alone steps of `unit_ms` (default: `step_times`')."""
        selection = self.threshold_selection or {}
        if not selection.get("round_weights"):
            raise ValueError("this head's threshold selection stores no replayed rounds, so its threshold cannot be "
                             "chosen for other step times: choose it again with `python -m "
                             "specdecpp.calibration.report ... --choose_threshold`")
        unit = unit_ms or step_times.target_alone_ms
        costs = [round(step_times.rounds_ms(weights, judged=True) / unit / selection["tokens"], 5)
                 for weights in selection["round_weights"]]
        return selection["thresholds"][costs.index(min(costs))]

    @property
    def reads_hidden_states(self) -> bool:
        """Whether the head reads the draft's hidden state; a head of features alone fits any draft."""
        return self.hidden_size > 0

    def input_projection(self) -> Linear | None:
        """The input projection's `(weight, bias)`, or None for a head without one (`width` None)."""
        return (self.projection.weight, self.projection.bias) if self.width is not None else None

    def blocks(self) -> list[Linear]:
        """The residual blocks' `(weight, bias)`, in order (what `head_logits` takes)."""
        return [(block.linear.weight, block.linear.bias) for block in self.model[:-1]]

    def output(self) -> Linear:
        """The output layer's `(weight, bias)`: rows (reject, accept)."""
        return self.model[-1].weight, self.model[-1].bias

    def forward(self, hidden_states: torch.Tensor | None, features: torch.Tensor | None = None) -> torch.Tensor:
        """Logits over (reject, accept) from hidden states (or None) and `features` `[..., len(features)]`."""
        if self.features and features is None:
            raise ValueError(f"this head also reads the features {self.features} of the judged token")
        return head_logits(hidden_states if self.reads_hidden_states else None, features if self.features else None,
                           self.input_projection(), self.blocks(), self.output())

    @torch.no_grad()
    def accept_prob(self, hidden_states: torch.Tensor, features: torch.Tensor | None = None) -> torch.Tensor:
        """P(accept) `[...]` as float32, computed in the head's own dtype."""
        return self(hidden_states, features).float().softmax(-1)[..., 1]

    # -- loading: accept the reference's shared-block layout as well as ours ---------------------
    def _load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load strictly, filling in the residual blocks a reference checkpoint (one shared block) left out."""
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
        """Also load a local folder holding only `pytorch_model.bin`, as the reference saved."""
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
    # `head.folder` is imported where a folder is written, so that this module stands on neither it nor the cost model.
    def save_pretrained(self, save_directory: str | Path, *, model_card_kwargs: dict | None = None, **kwargs):
        """The mixin's `save_pretrained`, the card's facts (`model_card_kwargs`) kept in the folder's `card.json`."""
        from specdecpp.head.folder import record_card_facts

        if model_card_kwargs:
            record_card_facts(save_directory, model_card_kwargs)
        return super().save_pretrained(save_directory, model_card_kwargs=model_card_kwargs, **kwargs)

    def _save_pretrained(self, save_directory: Path) -> None:
        """Save the weights and `config.json`, then `custom_generate/` and the card (`folder.write_head_files`)."""
        from specdecpp.head.folder import write_head_files

        super()._save_pretrained(save_directory)
        (Path(save_directory) / constants.CONFIG_NAME).write_text(json.dumps(self.config, sort_keys=True, indent=2))
        write_head_files(save_directory)

    def generate_model_card(self, *args, **kwargs) -> ModelCard:
        """The model card of this head's config with the facts `kwargs` (see `head.folder.render_card`)."""
        from specdecpp.head.folder import render_card

        return ModelCard(render_card(self.config, kwargs))
