"""Train the acceptance prediction head on the frozen draft's hidden states.

    torchrun --nproc_per_node N specdecpp/train.py --data_path train.jsonl --eval_data_path dev.jsonl \
        --model_name_or_path DRAFT --output_dir heads/mine --weight_mismatch 6 --resnet_num_layers 3 \
        --mixing_ratio 0.15 [--cache_hidden_states] [any TrainingArguments flag]

Each record becomes one sequence `prefix + z`, where `z_i` is the draft's proposal `draft[i]`, or,
with probability `mixing_ratio` (drawn once per record from the seed), the target's token
`tokens[i]`, whose label is then ignored; prefix positions are ignored too. The head reads the
draft's last-layer hidden state at each `z_i` and is trained with a weighted BCE on the soft label
`p_acc[i]` (DESIGN.md section 2); the eval metric is the mean binary KL(label || prediction).

Only the head trains and only the head is saved: `output_dir` and every `checkpoint-*` folder load
with `AcceptancePredictionHead.from_pretrained`, and `--resume_from_checkpoint` continues a run.
`--cache_hidden_states` runs the frozen draft once over the data and trains on the stored states.
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__" and not __package__:
    # run as `python specdecpp/train.py` (torchrun's way): import our modules through the package,
    # or their folder on sys.path would shadow top-level packages of the same name
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import gc
import json
import shutil
from dataclasses import dataclass, field

import numpy as np
import torch
from accelerate import PartialState
from datasets import Array2D, Dataset, Features, Sequence, Value, concatenate_datasets
from torch import nn
from tqdm import tqdm
from transformers import AutoConfig, HfArgumentParser, PreTrainedModel, Trainer, TrainingArguments, set_seed
from transformers.trainer import TRAINING_ARGS_NAME
from transformers.trainer_utils import EvalPrediction, get_last_checkpoint

from specdecpp.data_io import read_records
from specdecpp.head import AcceptancePredictionHead
from specdecpp.models import ModelLoadingArguments, is_peft_adapter, last_hidden_states, load_model, vocab_size
from specdecpp.publish import push_head

IGNORE = -100.0  # label of positions the loss skips (Trainer also pads predictions with -100)


@dataclass
class ModelArguments(ModelLoadingArguments):
    model_name_or_path: str | None = field(default=None, metadata={
        "help": "the draft model whose hidden states the head reads (Hub id, folder, PEFT adapter folder)"})
    resnet_num_layers: int = field(default=3, metadata={"help": "residual blocks in the head"})
    target_model_name: str | None = field(default=None, metadata={
        "help": "the target the data was built with; only recorded in the head's model card"})


@dataclass
class DataArguments:
    data_path: str | None = field(default=None, metadata={"help": "training records (JSON Lines or the reference's JSON)"})
    eval_data_path: str | None = field(default=None, metadata={"help": "eval records (reports binary KL)"})
    mixing_ratio: float = field(default=0.15, metadata={
        "help": "probability that a position shows the target's token instead of the draft's (its label ignored)"})


@dataclass
class HeadTrainingArguments(TrainingArguments):
    weight_mismatch: float = field(default=6.0, metadata={"help": "weight of the reject side of the BCE"})
    cache_hidden_states: bool = field(default=False, metadata={
        "help": "run the frozen draft once and train on the stored hidden states (fast when the draft is the cost)"})
    # Trainer's defaults would drop our columns and look for labels in the model's signature
    remove_unused_columns: bool = field(default=False, metadata={"help": "keep the dataset's columns (needed)"})
    label_names: list[str] | None = field(default_factory=lambda: ["labels"], metadata={"help": "label columns"})


# -- data -----------------------------------------------------------------------------------------
def make_example(record: dict, index: int, mixing_ratio: float, seed: int) -> dict:
    """`input_ids = prefix + z` and `labels` (p_acc where z is the draft's token, IGNORE elsewhere).
    The mixing draws depend only on (seed, record index): fixed per record, whatever the number of
    ranks, epochs, or whether hidden states are cached."""
    rng = np.random.default_rng([seed, index])
    mixed = rng.random(len(record["tokens"])) < mixing_ratio
    z = np.where(mixed, record["tokens"], record["draft"])
    labels = np.where(mixed, IGNORE, np.asarray(record["p_acc"], dtype=np.float64))
    return {"input_ids": list(record["prefix"]) + z.tolist(),
            "labels": [IGNORE] * len(record["prefix"]) + labels.tolist()}


def examples_dataset(records: list[dict], mixing_ratio: float, seed: int) -> Dataset:
    """The records as training examples (`input_ids`, `labels`)."""
    return Dataset.from_list([make_example(r, i, mixing_ratio, seed) for i, r in enumerate(records)])


def pad_batch(features: list[dict]) -> dict[str, torch.Tensor]:
    """Right-pad a list of examples into tensors: `input_ids` + `attention_mask`, or the cached
    `hidden_states`; `labels` padded with IGNORE."""
    width = max(len(f["labels"]) for f in features)
    labels = torch.full((len(features), width), IGNORE)
    for row, f in enumerate(features):
        labels[row, : len(f["labels"])] = torch.tensor(f["labels"], dtype=torch.float32)
    if "hidden_states" in features[0]:
        hidden = torch.zeros(len(features), width, features[0]["hidden_states"].shape[-1])
        for row, f in enumerate(features):
            hidden[row, : len(f["labels"])] = torch.tensor(f["hidden_states"], dtype=torch.float32)
        return {"hidden_states": hidden, "labels": labels}
    input_ids = torch.zeros(len(features), width, dtype=torch.long)
    attention_mask = torch.zeros(len(features), width, dtype=torch.long)
    for row, f in enumerate(features):
        input_ids[row, : len(f["input_ids"])] = torch.as_tensor(f["input_ids"])
        attention_mask[row, : len(f["input_ids"])] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


@torch.no_grad()
def cache_hidden_states(draft: PreTrainedModel, examples: Dataset, cache_dir: str, batch_size: int,
                        device: torch.device) -> Dataset:
    """The draft's last hidden states at the labelled positions of every example, computed once
    (each rank its contiguous share, written to `cache_dir` as Arrow files, memory-mapped back).
    Only labelled positions are stored: the head is position-wise, so the loss is unchanged."""
    state = PartialState()
    hidden_size = draft.config.get_text_config().hidden_size
    features = Features({"hidden_states": Array2D((None, hidden_size), "float32"), "labels": Sequence(Value("float32"))})
    os.makedirs(cache_dir, exist_ok=True)
    shard = examples.shard(state.num_processes, state.process_index, contiguous=True)
    rows = {"hidden_states": [], "labels": []}
    for start in tqdm(range(0, len(shard), batch_size), desc="caching draft hidden states",
                      disable=not state.is_local_main_process):
        batch = pad_batch([shard[i] for i in range(start, min(start + batch_size, len(shard)))])
        hidden = last_hidden_states(draft, batch["input_ids"].to(device), batch["attention_mask"].to(device)).float().cpu()
        for h, labels in zip(hidden, batch["labels"]):
            keep = labels != IGNORE
            rows["hidden_states"].append(h[keep].numpy())
            rows["labels"].append(labels[keep].numpy())
    path = os.path.join(cache_dir, f"rank{state.process_index}")
    Dataset.from_dict(rows, features=features).save_to_disk(path)
    state.wait_for_everyone()
    return concatenate_datasets([Dataset.load_from_disk(os.path.join(cache_dir, f"rank{r}"))
                                 for r in range(state.num_processes)]).with_format("numpy")


# -- model and loss ---------------------------------------------------------------------------------
class HeadOnDraft(nn.Module):
    """What the Trainer trains: the head, on hidden states it is given (cached) or that the frozen
    draft computes from `input_ids`. Returns the head's logits over (reject, accept)."""

    def __init__(self, head: AcceptancePredictionHead, draft: PreTrainedModel | None = None):
        super().__init__()
        self.head = head
        self.draft = draft
        if draft is not None:
            draft.requires_grad_(False)

    def train(self, mode: bool = True) -> HeadOnDraft:
        super().train(mode)
        if self.draft is not None:
            self.draft.eval()  # frozen means no dropout either
        return self

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                hidden_states: torch.Tensor | None = None) -> torch.Tensor:
        if hidden_states is None:
            with torch.no_grad():
                hidden_states = last_hidden_states(self.draft, input_ids, attention_mask)
        return self.head(hidden_states)


def acceptance_loss(logits: torch.Tensor, labels: torch.Tensor, weight_mismatch: float) -> torch.Tensor:
    """`sum[w (1-y) (-log(1-s)) + y (-log s)] / sum[w (1-y) + y]` over positions whose label is not
    IGNORE, `s` the predicted accept probability, computed from log-softmax for stability."""
    keep = labels != IGNORE
    y = labels[keep].float()
    log_probs = logits[keep].float().log_softmax(-1)  # [:, 0] = log(1 - s), [:, 1] = log s
    weights = weight_mismatch * (1 - y)
    return (weights * -log_probs[:, 0] + y * -log_probs[:, 1]).sum() / (weights + y).sum().clamp_min(1e-12)


def binary_kl(labels: np.ndarray, predictions: np.ndarray, eps: float = 1e-7) -> float:
    """Mean binary KL(label || prediction) over the positions whose label is not IGNORE."""
    keep = labels != IGNORE
    y, s = labels[keep].astype(np.float64), np.clip(predictions[keep].astype(np.float64), eps, 1 - eps)
    kl = (np.where(y > 0, y * np.log(np.maximum(y, eps) / s), 0.0)
          + np.where(y < 1, (1 - y) * np.log(np.maximum(1 - y, eps) / (1 - s)), 0.0))
    return float(kl.mean())


def compute_metrics(prediction: EvalPrediction) -> dict[str, float]:
    """Trainer's eval metrics: binary KL and the mean predicted / labelled accept rates."""
    labels, predictions = np.asarray(prediction.label_ids), np.asarray(prediction.predictions)
    keep = labels != IGNORE
    return {"binary_kl": binary_kl(labels, predictions), "mean_prediction": float(predictions[keep].mean()),
            "mean_label": float(labels[keep].mean())}


class HeadTrainer(Trainer):
    """Trainer with the acceptance loss, whose checkpoints hold only the head (a folder that
    `AcceptancePredictionHead.from_pretrained` loads, with a model card) and resume from one."""

    loss_is_scaled_for_ga = False  # compute_loss returns a per-batch mean

    def __init__(self, *args, card: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.card = card or {}

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs["labels"]
        logits = model(**{k: v for k, v in inputs.items() if k != "labels"})
        loss = acceptance_loss(logits, labels, self.args.weight_mismatch)
        return (loss, {"accept_prob": logits.float().softmax(-1)[..., 1]}) if return_outputs else loss

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        output_dir = output_dir or self.args.output_dir
        if not self.args.should_save:
            return
        head = self.accelerator.unwrap_model(self.model).head
        if state_dict:  # DeepSpeed hands over the gathered weights of the whole wrapper
            head = AcceptancePredictionHead(head.hidden_size, head.num_layers)
            head.load_state_dict({k[len("head."):]: v for k, v in state_dict.items() if k.startswith("head.")})
        evals = [log for log in self.state.log_history if "eval_binary_kl" in log]
        metrics = {k: round(v, 5) for k, v in evals[-1].items() if k.startswith("eval_")} if evals else {}
        readme = os.path.join(output_dir, "README.md")
        if os.path.exists(readme):
            os.remove(readme)  # save_pretrained keeps an existing card; ours has newer metrics
        head.save_pretrained(output_dir, model_card_kwargs=self.card | {"eval_metrics": metrics})
        torch.save(self.args, os.path.join(output_dir, TRAINING_ARGS_NAME))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        saved = AcceptancePredictionHead.from_pretrained(resume_from_checkpoint)
        head = self.accelerator.unwrap_model(model or self.model).head
        check_head_fits(saved.hidden_size, saved.num_layers, head.hidden_size, head.num_layers, resume_from_checkpoint)
        head.load_state_dict(saved.state_dict())

    def _load_best_model(self) -> None:
        self._load_from_checkpoint(self.state.best_model_checkpoint)

    # -- publishing (--push_to_hub --hub_model_id ID): the head folder only, never the draft's weights,
    # the optimizer state, training_args.bin or the Trainer's own model card ---------------------------
    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True,
                    token: str | None = None, revision: str | None = None, private: bool | None = None, **kwargs):
        """Save the head, then publish `output_dir` with `specdecpp.publish.push_head` (rank 0)."""
        self.save_model(_internal_call=True)
        if not self.is_world_process_zero():
            return None
        return push_head(self.args.output_dir, self._hub_repo_id(),
                         private=self.args.hub_private_repo if private is None else private,
                         token=token or self.args.hub_token, revision=revision or self.args.hub_revision,
                         commit_message=commit_message or "End of training")

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """`--hub_strategy every_save` (the default) and the checkpoint strategies: publish each saved
        checkpoint's head the same way (`end` publishes only at the end)."""
        if self.is_world_process_zero() and self.args.hub_strategy != "end":
            push_head(checkpoint_folder, self._hub_repo_id(), private=bool(self.args.hub_private_repo),
                      token=self.args.hub_token, revision=self.args.hub_revision,
                      commit_message=f"Training in progress, step {self.state.global_step}")

    def _hub_repo_id(self) -> str:
        return self.hub_model_id or self.args.hub_model_id or os.path.basename(os.path.abspath(self.args.output_dir))


def check_data_fits_draft(records: list[dict], draft: PreTrainedModel) -> None:
    """ValueError when the records hold token ids the draft has no embedding for."""
    top_id = max(max(r["prefix"] + r["tokens"] + r["draft"]) for r in records)
    if top_id >= vocab_size(draft):
        raise ValueError(f"the data holds token id {top_id} but the draft's vocabulary has {vocab_size(draft)} "
                         "tokens: the data was built with another tokenizer")


def check_head_fits(saved_hidden: int, saved_layers: int, hidden: int, layers: int, where: str) -> None:
    """ValueError unless a saved head has the shape of the one being trained."""
    if saved_hidden != hidden:
        raise ValueError(f"the head in {where} reads hidden states of size {saved_hidden}, but the draft's hidden size "
                         f"is {hidden}: it was trained for another draft (use a fresh --output_dir)")
    if saved_layers != layers:
        raise ValueError(f"the head in {where} has {saved_layers} residual layers, but --resnet_num_layers is {layers}")


# -- the run ----------------------------------------------------------------------------------------
def draft_hidden_size(name_or_path: str, trust_remote_code: bool) -> int:
    """The draft's hidden size from its config alone (no weights loaded)."""
    if is_peft_adapter(name_or_path):
        from peft import PeftConfig

        name_or_path = PeftConfig.from_pretrained(name_or_path).base_model_name_or_path
    return AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code).get_text_config().hidden_size


def resolve_checkpoint(args: HeadTrainingArguments) -> str | None:
    """`--resume_from_checkpoint`: a folder, or `True` for the newest checkpoint in output_dir."""
    value = args.resume_from_checkpoint
    if value in (None, False, "False", "false", ""):
        return None
    if value in (True, "True", "true"):
        value = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
        if value is None:
            raise ValueError(f"--resume_from_checkpoint True: no checkpoint-* folder in {args.output_dir}")
    if not os.path.isfile(os.path.join(value, "config.json")):
        raise ValueError(f"--resume_from_checkpoint {value}: not a head checkpoint (no config.json)")
    return value


def train(model_args: ModelArguments, data_args: DataArguments, args: HeadTrainingArguments) -> HeadTrainer:
    """Train a head as the command line does; returns the Trainer (its model's `.head` is trained,
    and `args.output_dir` holds the saved head). Bad settings and bad data fail before the draft loads."""
    if not model_args.model_name_or_path or not data_args.data_path:
        raise ValueError("--model_name_or_path (the draft) and --data_path are required")
    if not 0 <= data_args.mixing_ratio < 1:
        raise ValueError(f"--mixing_ratio must be in [0, 1), got {data_args.mixing_ratio}")
    if args.weight_mismatch <= 0 or model_args.resnet_num_layers < 0:
        raise ValueError(f"need --weight_mismatch > 0 and --resnet_num_layers >= 0, got {args.weight_mismatch}, "
                         f"{model_args.resnet_num_layers}")
    train_records = read_records(data_args.data_path)
    eval_records = read_records(data_args.eval_data_path) if data_args.eval_data_path else None
    hidden_size = draft_hidden_size(model_args.model_name_or_path, model_args.trust_remote_code)
    checkpoint = resolve_checkpoint(args)
    if checkpoint:
        with open(os.path.join(checkpoint, "config.json"), encoding="utf-8") as f:
            saved = json.load(f)
        check_head_fits(saved["hidden_size"], saved["num_layers"], hidden_size, model_args.resnet_num_layers, checkpoint)

    draft = load_model(model_args.model_name_or_path, model_args.torch_dtype, model_args.device_map,
                       model_args.trust_remote_code)
    check_data_fits_draft(train_records + (eval_records or []), draft)
    set_seed(args.seed)  # the head's initial weights, like everything else, follow --seed
    head = AcceptancePredictionHead(hidden_size, model_args.resnet_num_layers)
    train_set = examples_dataset(train_records, data_args.mixing_ratio, args.seed)
    eval_set = examples_dataset(eval_records, data_args.mixing_ratio, args.seed) if eval_records else None
    if args.cache_hidden_states:
        cache_dir = os.path.join(args.output_dir, "hidden_states_cache")
        draft.to(args.device)
        batch = args.per_device_eval_batch_size
        train_set = cache_hidden_states(draft, train_set, os.path.join(cache_dir, "train"), batch, args.device)
        if eval_set is not None:
            eval_set = cache_hidden_states(draft, eval_set, os.path.join(cache_dir, "eval"), batch, args.device)
        model = HeadOnDraft(head)
        del draft
    else:
        model = HeadOnDraft(head, draft)

    card = {"draft_model": model_args.model_name_or_path, "target_model": model_args.target_model_name,
            "training_data": ", ".join(p for p in (data_args.data_path, data_args.eval_data_path) if p)}
    trainer = HeadTrainer(model=model, args=args, train_dataset=train_set, eval_dataset=eval_set,
                          data_collator=pad_batch, compute_metrics=compute_metrics, card=card)
    trainer.train(resume_from_checkpoint=checkpoint)
    if eval_set is not None:
        trainer.evaluate()
    trainer.save_model()
    trainer.accelerator.wait_for_everyone()  # no rank may still read the cache when rank 0 removes it
    if args.cache_hidden_states and trainer.is_world_process_zero():
        shutil.rmtree(os.path.join(args.output_dir, "hidden_states_cache"), ignore_errors=True)
    return trainer


def main(argv: list[str] | None = None) -> None:
    """Command line: `python specdecpp/train.py --help` (all TrainingArguments flags work)."""
    parser = HfArgumentParser((ModelArguments, DataArguments, HeadTrainingArguments))
    model_args, data_args, args = parser.parse_args_into_dataclasses(args=sys.argv[1:] if argv is None else argv)
    trainer = train(model_args, data_args, args)
    release_process_group(trainer)


def release_process_group(trainer: Trainer) -> None:
    """Free the trainer's DDP model, then destroy the process group, in that order.

    DDP's C++ reducer holds the gloo group; if the reducer drops the group's last reference (at exit, or when the
    trainer is collected) gloo joins its worker thread while holding the GIL, and that thread may need the GIL to
    free a finished collective's tensors: a deadlock, or an abort at interpreter exit. Freed first, the reducer
    leaves the last reference to `destroy_process_group`, which releases the GIL before gloo tears down.
    """
    accelerator = trainer.accelerator
    accelerator.free_memory()
    trainer.model_wrapped = trainer.model = None
    gc.collect()
    accelerator.end_training()


if __name__ == "__main__":
    main()
