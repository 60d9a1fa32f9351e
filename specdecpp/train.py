"""Train the acceptance prediction head on the frozen draft's hidden states, `torchrun --nproc_per_node N
specdecpp/train.py --draft DRAFT --records train.jsonl --output heads/mine [flags]`. Only the head is saved."""
from __future__ import annotations

import fnmatch
import gc
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass

import torch
from accelerate import PartialState
from datasets import Array2D, Array3D, Dataset, Features, Sequence, Value, concatenate_datasets
from torch import nn
from tqdm import tqdm
from transformers import HfArgumentParser, PreTrainedModel, Trainer, TrainingArguments, set_seed
from transformers.trainer import SCHEDULER_NAME, TRAINER_STATE_NAME, TRAINING_ARGS_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from specdecpp.checks import check_data_fits_draft, check_head_fits_draft, hidden_size, text_config
from specdecpp.cli import common_field, input_errors, option
from specdecpp.data.io import read_records
from specdecpp.head.inputs import head_inputs, judged_states, make_example, pad_batch
from specdecpp.head.model import ALIGNMENTS, FEATURES, AcceptancePredictionHead
from specdecpp.head.objective import IGNORE, acceptance_loss, compute_metrics
from specdecpp.head.publish import push_head
from specdecpp.models import PairArguments, load_head, load_model


def examples_dataset(records: list[dict], mixing_ratio: float, seed: int, alignment: str = "reader",
                     num_candidates: int = 0) -> Dataset:
    return Dataset.from_list([make_example(r, i, mixing_ratio, seed, alignment, num_candidates)
                              for i, r in enumerate(records)])


@dataclass
class ModelArguments:
    """The head to train; `--target`, the pair's other model, is only recorded in the card."""

    resnet_num_layers: int = option(3, "residual blocks in the head")
    head_alignment: str = option("proposer", "which draft state judges a drafted token: 'proposer' (the forward that "
        "proposes it) or 'reader' (the reference's: one draft step later; trained with --mixing_ratio)",
                                 choices=ALIGNMENTS)
    head_features: list[str] = option(["log_q", "entropy"], "features of the judged token under the proposing logits "
        f"that a proposer head also reads (any of {', '.join(FEATURES)}; 'none' for the hidden state alone)")
    head_width: int | None = option(None, "width of the residual blocks, the inputs projected to it first: fewer "
        "weights per judgement (default: the inputs' own width, no projection)")
    head_reads_hidden_states: bool = option(True, "whether the head reads the draft's hidden state; false: a head of "
        "the logit features alone (hidden_size 0 in its config), which fits any draft")


@dataclass
class DataArguments:
    records: str | None = common_field("records", aliases=("--data_path",), default=None, help="training records")
    eval_records: str | None = common_field("eval_records", default=None, help="eval records (reports binary KL)")
    mixing_ratio: float = option(0.15, "reader heads only: probability that a position shows the target's token "
        "instead of the draft's (its label ignored); a proposer head trains on the target's continuation, unmixed")
    train_candidates: int = option(0, "proposer heads with --head_features: train (and evaluate) on each position's "
        "first N candidates (build_data --num_candidates), each judged with its own features, by candidate_p_acc")


@dataclass
class HeadTrainingArguments(TrainingArguments):
    # TrainingArguments' own fields, under the common flags as well (`--output`, `--random_seed`)
    output_dir: str | None = option(None, "the head's folder: the trained head and its checkpoint-* folders go there",
                                    aliases=["--output"])
    seed: int = common_field("seed", default=42, help="seeds the head's initial weights, the data order and mixing")
    weight_mismatch: float = option(6.0, "weight of the reject side of the BCE")
    cache_hidden_states: bool = option(False, "run the frozen draft once and train on the stored hidden states (fast)")
    # Trainer's defaults would drop our columns and look for labels in the model's signature
    remove_unused_columns: bool = option(False, "keep the dataset's columns (needed)")
    label_names: list[str] | None = option(["labels"], "label columns")


@torch.no_grad()
def cache_hidden_states(draft: PreTrainedModel, feature_names: list[str], examples: Dataset, cache_dir: str,
                        batch_size: int, device: torch.device) -> Dataset:
    """The head's inputs at every example's labelled positions, computed once (each rank its share) into `cache_dir`."""
    state = PartialState()
    hidden_size = draft.config.get_text_config().hidden_size
    candidates = len(examples[0]["labels"][-1]) if isinstance(examples[0]["labels"][-1], list) else 0
    columns = {"hidden_states": Array2D((None, hidden_size), "float32"),
               "labels": Array2D((None, candidates), "float32") if candidates else Sequence(Value("float32"))}
    if feature_names:
        columns["features"] = Array3D((None, candidates, len(feature_names)), "float32") if candidates \
            else Array2D((None, len(feature_names)), "float32")
    os.makedirs(cache_dir, exist_ok=True)
    shard = examples.shard(state.num_processes, state.process_index, contiguous=True)
    rows = {name: [] for name in columns}
    for start in tqdm(range(0, len(shard), batch_size), desc="caching draft hidden states",
                      disable=not state.is_local_main_process):
        batch = pad_batch([shard[i] for i in range(start, min(start + batch_size, len(shard)))])
        hidden, features = head_inputs(draft, feature_names, batch["input_ids"].to(device),
                                       batch["attention_mask"].to(device), batch.get("candidates"))
        for row, labels in enumerate(batch["labels"]):
            keep = (labels != IGNORE).any(-1) if candidates else labels != IGNORE
            rows["hidden_states"].append(hidden[row][keep.to(hidden.device)].float().cpu().numpy())
            rows["labels"].append(labels[keep].numpy())
            if feature_names:
                rows["features"].append(features[row][keep.to(features.device)].float().cpu().numpy())
    path = os.path.join(cache_dir, f"rank{state.process_index}")
    Dataset.from_dict(rows, features=Features(columns)).save_to_disk(path)
    state.wait_for_everyone()
    return concatenate_datasets([Dataset.load_from_disk(os.path.join(cache_dir, f"rank{r}"))
                                 for r in range(state.num_processes)]).with_format("numpy")


class HeadOnDraft(nn.Module):
    """The head on cached hidden states or those of the frozen draft; returns logits over (reject, accept)."""

    def __init__(self, head: AcceptancePredictionHead, draft: PreTrainedModel | None = None):
        super().__init__()
        self.head, self.draft = head, draft
        if draft is not None:
            draft.requires_grad_(False)

    def train(self, mode: bool = True) -> HeadOnDraft:
        super().train(mode)
        if self.draft is not None:
            self.draft.eval()  # frozen means no dropout either
        return self

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                candidates: torch.Tensor | None = None, hidden_states: torch.Tensor | None = None,
                features: torch.Tensor | None = None) -> torch.Tensor:
        if hidden_states is None:
            with torch.no_grad():
                hidden_states, features = head_inputs(self.draft, self.head.features, input_ids, attention_mask,
                                                      candidates)
        return self.head(judged_states(hidden_states, features), features)


class HeadTrainer(Trainer):
    """Trainer with the acceptance loss whose checkpoints hold only the head (and a card)."""

    loss_is_scaled_for_ga = False  # compute_loss returns a per-batch mean

    def __init__(self, *args, card: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.card = card or {}

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        logits = model(**{k: v for k, v in inputs.items() if k != "labels"})
        loss = acceptance_loss(logits, inputs["labels"], self.args.weight_mismatch)
        return (loss, {"accept_prob": logits.float().softmax(-1)[..., 1]}) if return_outputs else loss

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        output_dir = output_dir or self.args.output_dir
        if not self.args.should_save:
            return
        head = self.accelerator.unwrap_model(self.model).head
        if state_dict:  # DeepSpeed hands over the gathered weights of the whole wrapper
            head = AcceptancePredictionHead(head.config)
            head.load_state_dict({k[len("head."):]: v for k, v in state_dict.items() if k.startswith("head.")})
        evals = [log for log in self.state.log_history if "eval_binary_kl" in log]
        metrics = {k: round(v, 5) for k, v in evals[-1].items() if k.startswith("eval_")} if evals else {}
        head.save_pretrained(output_dir, model_card_kwargs=self.card | {"eval_metrics": metrics})
        torch.save(self.args, os.path.join(output_dir, TRAINING_ARGS_NAME))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        saved = load_head(resume_from_checkpoint)
        head = self.accelerator.unwrap_model(model or self.model).head
        check_head_fits(saved.config, head.config, resume_from_checkpoint)
        head.load_state_dict(saved.state_dict())

    def _load_best_model(self) -> None:
        self._load_from_checkpoint(self.state.best_model_checkpoint)

    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True,
                    token: str | None = None, revision: str | None = None, private: bool | None = None, **kwargs):
        """Save the head, then publish `output_dir` with `push_head` (rank 0)."""
        self.save_model(_internal_call=True)
        if not self.is_world_process_zero():
            return None
        return push_head(self.args.output_dir, self._hub_repo_id(),
                         private=self.args.hub_private_repo if private is None else private,
                         token=token or self.args.hub_token, revision=revision or self.args.hub_revision,
                         commit_message=commit_message or "End of training")

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        if self.is_world_process_zero() and self.args.hub_strategy != "end":
            push_head(checkpoint_folder, self._hub_repo_id(), private=bool(self.args.hub_private_repo),
                      token=self.args.hub_token, revision=self.args.hub_revision,
                      commit_message=f"Training in progress, step {self.state.global_step}")

    def _hub_repo_id(self) -> str:
        return self.hub_model_id or self.args.hub_model_id or os.path.basename(os.path.abspath(self.args.output_dir))


def check_head_fits(saved: dict, config: dict, where: str) -> None:
    """ValueError unless a saved head's config has the trained head's shape, alignment and features."""
    check_head_fits_draft(saved["hidden_size"], config["hidden_size"], f"the head in {where}",
                          " (use a fresh --output)")
    for key, flag in (("num_layers", "--resnet_num_layers"), ("alignment", "--head_alignment"),
                      ("features", "--head_features"), ("hidden_size", "--head_reads_hidden_states"),
                      ("width", "--head_width")):
        theirs, ours = AcceptancePredictionHead(saved).config.get(key), config.get(key)
        if theirs != ours:
            raise ValueError(f"the head in {where} has {key} {theirs}, but {flag} asks for {ours}")


def head_config_from(model_args: ModelArguments, hidden_size: int) -> dict:
    """The config of the head to train."""
    features = [] if model_args.head_alignment == "reader" else [f for f in model_args.head_features if f != "none"]
    if not model_args.head_reads_hidden_states:
        if not features:
            raise ValueError("--head_reads_hidden_states false needs --head_features (a proposer head's logit features)")
        hidden_size = 0
    return {"hidden_size": hidden_size, "num_layers": model_args.resnet_num_layers,
            "alignment": model_args.head_alignment, "features": features, "width": model_args.head_width}


def check_candidates(train_candidates: int, head_config: dict, records: list[dict]) -> None:
    """ValueError unless training on `train_candidates` candidates (0: none) fits the head and the records."""
    if train_candidates < 0:
        raise ValueError(f"--train_candidates must be >= 0, got {train_candidates}")
    if not train_candidates:
        return
    if head_config["alignment"] != "proposer" or not head_config["features"]:
        raise ValueError("--train_candidates needs a proposer head with --head_features: the candidates of a "
                         "position share its draft state, and only their features tell them apart")
    if missing := sum("candidates" not in record for record in records):
        raise ValueError(f"--train_candidates: {missing} of {len(records)} records hold no candidates (build them "
                         "with build_data --num_candidates)")


def missing_checkpoint_files(folder: str) -> list[str]:
    """What `folder` lacks of a complete checkpoint."""
    names = os.listdir(folder)

    def has(*patterns: str) -> bool:
        return any(fnmatch.fnmatch(name, pattern) for name in names for pattern in patterns)

    deepspeed = has("latest")  # DeepSpeed's own sub-folder, named in `latest`, holds optimizer and scheduler
    present = {"config.json": has("config.json"), "model.safetensors": has("model.safetensors", "pytorch_model.bin"),
               "optimizer.pt": deepspeed or has("optimizer*"),  # optimizer.pt/.bin, FSDP's optimizer_* folder
               SCHEDULER_NAME: deepspeed or has(SCHEDULER_NAME), TRAINER_STATE_NAME: has(TRAINER_STATE_NAME)}
    return [name for name, found in present.items() if not found]


def latest_complete_checkpoint(output_dir: str, report: bool = True) -> str:
    """The newest complete `checkpoint-*` of `output_dir` (skipped ones reported when `report`), else ValueError."""
    pattern = re.compile(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)")
    steps = {int(m.group(1)): os.path.join(output_dir, name) for name in os.listdir(output_dir)
             if (m := pattern.fullmatch(name)) and os.path.isdir(os.path.join(output_dir, name))}
    for step in sorted(steps, reverse=True):
        if not (missing := missing_checkpoint_files(steps[step])):
            return steps[step]
        if report:
            print(f"skipping {steps[step]}: incomplete, no {', '.join(missing)} (its save was interrupted)",
                  file=sys.stderr)
    raise ValueError(f"--resume_from_checkpoint True: no complete checkpoint-* folder in {output_dir}"
                     + (" (all are incomplete)" if steps else ""))


def resolve_checkpoint(args: HeadTrainingArguments) -> str | None:
    """`--resume_from_checkpoint`: a folder, or `True` for `latest_complete_checkpoint`."""
    value = args.resume_from_checkpoint
    if value in (None, False, "False", "false", ""):
        return None
    if value in (True, "True", "true"):
        if not os.path.isdir(args.output_dir):
            raise ValueError(f"--resume_from_checkpoint True: no checkpoint-* folder in {args.output_dir}")
        value = latest_complete_checkpoint(args.output_dir, report=args.process_index == 0)
    if not os.path.isfile(os.path.join(value, "config.json")):
        raise ValueError(f"--resume_from_checkpoint {value}: not a head checkpoint (no config.json)")
    return value


def train(pair: PairArguments, model_args: ModelArguments, data_args: DataArguments,
          args: HeadTrainingArguments) -> HeadTrainer:
    """Train a head for `pair`'s draft as the command line does; returns the Trainer (bad input fails early)."""
    pair.require("draft")
    if not data_args.records:
        raise ValueError("--records (the training records) is required")
    if not 0 <= data_args.mixing_ratio < 1:
        raise ValueError(f"--mixing_ratio must be in [0, 1), got {data_args.mixing_ratio}")
    if args.weight_mismatch <= 0 or model_args.resnet_num_layers < 0:
        raise ValueError(f"need --weight_mismatch > 0 and --resnet_num_layers >= 0, got {args.weight_mismatch}, "
                         f"{model_args.resnet_num_layers}")
    train_records = read_records(data_args.records)
    eval_records = read_records(data_args.eval_records) if data_args.eval_records else None
    head_config = head_config_from(model_args, hidden_size(text_config(pair.draft, pair.trust_remote_code)))
    check_candidates(data_args.train_candidates, head_config, train_records + (eval_records or []))
    if checkpoint := resolve_checkpoint(args):
        with open(os.path.join(checkpoint, "config.json"), encoding="utf-8") as f:
            check_head_fits(json.load(f), head_config, checkpoint)
        if missing := missing_checkpoint_files(checkpoint):
            raise ValueError(f"--resume_from_checkpoint {checkpoint} is incomplete, no {', '.join(missing)} (its save "
                             "was interrupted): resume from an earlier checkpoint, or pass True to take the newest "
                             "complete one")
    draft = load_model(pair.draft, **pair.loading())
    check_data_fits_draft(train_records + (eval_records or []), draft)
    set_seed(args.seed)
    head = AcceptancePredictionHead(head_config)
    layout = (data_args.mixing_ratio, args.seed, head.alignment, data_args.train_candidates)
    train_set = examples_dataset(train_records, *layout)
    eval_set = examples_dataset(eval_records, *layout) if eval_records else None
    if args.cache_hidden_states:
        cache_dir = os.path.join(args.output_dir, "hidden_states_cache")
        train_set, eval_set = (examples if examples is None else cache_hidden_states(
            draft.to(args.device), head.features, examples, os.path.join(cache_dir, name),
            args.per_device_eval_batch_size, args.device) for name, examples in (("train", train_set),
                                                                                 ("eval", eval_set)))
        draft = None  # the head trains on the stored states alone
    card = {"draft": pair.draft, "target": pair.target,
            "training_data": ", ".join(p for p in (data_args.records, data_args.eval_records) if p)}
    trainer = HeadTrainer(model=HeadOnDraft(head, draft), args=args, train_dataset=train_set, eval_dataset=eval_set,
                          data_collator=pad_batch, compute_metrics=compute_metrics, card=card)
    trainer.train(resume_from_checkpoint=checkpoint)
    if eval_set is not None:
        trainer.evaluate()
    trainer.save_model()
    trainer.accelerator.wait_for_everyone()  # no rank may still read the cache when rank 0 removes it
    if args.cache_hidden_states and trainer.is_world_process_zero():
        shutil.rmtree(os.path.join(args.output_dir, "hidden_states_cache"), ignore_errors=True)
    return trainer


FLAGS = (PairArguments, ModelArguments, DataArguments, HeadTrainingArguments)


def main(argv: list[str] | None = None) -> None:
    """Command line: `python specdecpp/train.py --help` (all TrainingArguments flags work)."""
    with input_errors("train"):
        flags = HfArgumentParser(FLAGS).parse_args_into_dataclasses(args=sys.argv[1:] if argv is None else argv)
        trainer = train(*flags)
    release_process_group(trainer)


def release_process_group(trainer: Trainer) -> None:
    """Free the trainer's DDP model, then destroy the process group (the other way round, gloo can deadlock)."""
    accelerator = trainer.accelerator
    accelerator.free_memory()
    trainer.model_wrapped = trainer.model = None
    gc.collect()
    accelerator.end_training()


if __name__ == "__main__":
    if not __package__:
        # run as a script: this folder, first on sys.path, would shadow top-level packages of our modules' names
        del sys.path[0]
    main()
