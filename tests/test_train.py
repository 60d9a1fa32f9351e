"""Training the head: the mixing, what is saved, resuming, caching, ranks, wandb."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import free_port
from safetensors.torch import load_file
from transformers import set_seed

from specdecpp.head.inputs import make_example
from specdecpp.head.model import AcceptancePredictionHead, logit_features
from specdecpp.head.objective import IGNORE, binary_kl
from specdecpp.models import PairArguments, load_model
from specdecpp.train import DataArguments, HeadTrainingArguments, ModelArguments, latest_complete_checkpoint, main, train

N_RECORDS = 12


def synthetic_records(n: int, seed: int = 0, vocab: int = 64) -> list[dict]:
    """Records of the right shape whose labels follow a learnable rule (accept even draft ids)."""
    rng = np.random.default_rng(seed)
    records = []
    for _ in range(n):
        prefix = [1] + rng.integers(4, vocab, rng.integers(2, 6)).tolist()
        tokens, draft = rng.integers(4, vocab, 10).tolist(), rng.integers(4, vocab, 10).tolist()
        p_acc = [float(d % 2 == 0) for d in draft]
        records.append({"prefix": prefix, "tokens": tokens, "draft": draft, "p_acc": p_acc,
                        "log_p_draft": [-1.0] * 10, "log_p_target": [-2.0] * 10})
    return records


@pytest.fixture(scope="module")
def data_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("train-data")
    paths = []
    for name, seed in (("train", 0), ("eval", 1)):
        with open(root / f"{name}.jsonl", "w") as f:
            for r in synthetic_records(N_RECORDS if name == "train" else 4, seed):
                f.write(json.dumps(r) + "\n")
        paths.append(str(root / f"{name}.jsonl"))
    return tuple(paths)


def run(pair_dirs, data_files, output_dir, **kw):
    pair = PairArguments(draft=kw.pop("draft", pair_dirs[1]), target="tiny-target")
    model_args = ModelArguments(resnet_num_layers=kw.pop("layers", 2), head_alignment=kw.pop("alignment", "proposer"),
                                head_width=kw.pop("width", None))
    data_args = DataArguments(records=data_files[0], eval_records=data_files[1], mixing_ratio=0.2)
    settings = dict(output_dir=str(output_dir), num_train_epochs=2, per_device_train_batch_size=4, learning_rate=5e-2,
                    report_to="none", save_strategy="steps", save_steps=3, logging_steps=1, seed=0, use_cpu=True,
                    disable_tqdm=True, eval_strategy="no", weight_mismatch=3.0)
    return train(pair, model_args, data_args, HeadTrainingArguments(**(settings | kw)))


def test_mixing_replaces_draft_tokens_and_ignores_their_labels():
    record = synthetic_records(1)[0] | {"tokens": list(range(4, 64)) * 10, "draft": list(range(63, 3, -1)) * 10,
                                        "p_acc": [0.5] * 600}
    n_prefix = len(record["prefix"])
    plain = make_example(record, 0, 0.0, seed=0)
    assert plain["input_ids"] == record["prefix"] + record["draft"]
    assert plain["labels"] == [IGNORE] * n_prefix + record["p_acc"]
    mixed = make_example(record, 0, 0.3, seed=0)
    ids, labels = np.array(mixed["input_ids"][n_prefix:]), np.array(mixed["labels"][n_prefix:])
    replaced = labels == IGNORE
    assert 0.22 < replaced.mean() < 0.38
    assert (ids[replaced] == np.array(record["tokens"])[replaced]).all()
    assert (ids[~replaced] == np.array(record["draft"])[~replaced]).all() and (labels[~replaced] == 0.5).all()
    assert mixed == make_example(record, 0, 0.3, seed=0), "draws are fixed per (seed, record)"
    assert mixed != make_example(record, 1, 0.3, seed=0)


def test_proposer_example_labels_the_state_that_proposes_each_draft_token():
    record = {"prefix": [1, 7, 8], "tokens": [10, 11, 12, 13], "draft": [10, 21, 12, 23], "p_acc": [1.0, 0.0, 1.0, 0.0]}
    example = make_example(record, 0, 0.5, seed=0, alignment="proposer")  # no mixing for a proposer
    # the state at 8 (last prompt token) proposes draft[0]; the state at tokens[i-1] proposes draft[i]
    assert example["input_ids"] == [1, 7, 8, 10, 11, 12]
    assert example["labels"] == [IGNORE, IGNORE, 1.0, 0.0, 1.0, 0.0]
    assert example["candidates"] == [-1, -1, 10, 21, 12, 23]


def test_proposer_example_with_candidates_labels_each_candidate_from_the_proposing_state():
    record = {"prefix": [1, 7], "tokens": [10, 11, 12], "draft": [10, 21, 12], "p_acc": [1.0, 0.0, 1.0],
              "candidates": [[10, 30], [21, 11, 5], [12]], "candidate_p_acc": [[1.0, 0.0], [0.0, 1.0, 0.0], [1.0]]}
    example = make_example(record, 0, 0.5, seed=0, alignment="proposer", num_candidates=2)
    assert example["input_ids"] == [1, 7, 10, 11]
    assert example["candidates"] == [[-1, -1], [10, 30], [21, 11], [12, -1]]
    assert example["labels"] == [[IGNORE, IGNORE], [1.0, 0.0], [0.0, 1.0], [1.0, IGNORE]]
    assert make_example(record, 0, 0.5, seed=0, alignment="proposer") == make_example(
        {k: v for k, v in record.items() if not k.startswith("candidate")}, 0, 0.5, seed=0, alignment="proposer"), \
        "without --train_candidates the records' candidates change nothing"
    with pytest.raises(ValueError, match="build_data --num_candidates"):
        make_example(synthetic_records(1)[0], 0, 0.0, seed=0, alignment="proposer", num_candidates=2)


def with_teacher_candidates(draft, teacher: AcceptancePredictionHead, record: dict, n: int = 3) -> dict:
    """`record` with `n` candidates per position (the drafted token, then the two next ids) labelled by the
    teacher's P(accept) for each, judged from the state that proposed the drafted token."""
    candidates = [[d] + [(d + j) % 60 + 4 for j in range(1, n)] for d in record["draft"]]
    labels = [teacher_p_acc(draft, teacher, record | {"draft": [c[j] for c in candidates]}) for j in range(n)]
    return record | {"candidates": candidates, "candidate_p_acc": [list(column) for column in zip(*labels)],
                     "p_acc": labels[0]}


@pytest.mark.parametrize("cache", [False, True])
def test_head_learns_to_judge_siblings_from_their_features(pair_dirs, tmp_path, cache):
    draft = load_model(pair_dirs[1])
    torch.manual_seed(0)
    teacher = AcceptancePredictionHead(32, 0, alignment="proposer", features=["log_q", "log_rank"])
    torch.nn.init.normal_(teacher.model[-1].weight)
    paths = []
    for name, seed, n in (("train", 0, 24), ("eval", 1, 8)):
        paths.append(tmp_path / f"{name}.jsonl")
        paths[-1].write_text("".join(json.dumps(with_teacher_candidates(draft, teacher, r)) + "\n"
                                     for r in synthetic_records(n, seed)))
    trainer = train(PairArguments(draft=pair_dirs[1]),
                    ModelArguments(resnet_num_layers=1, head_features=["log_q", "log_rank"]),
                    DataArguments(records=str(paths[0]), eval_records=str(paths[1]), train_candidates=3),
                    HeadTrainingArguments(output_dir=str(tmp_path / "out"), num_train_epochs=10, learning_rate=5e-2,
                                          per_device_train_batch_size=4, weight_mismatch=1.0, report_to="none",
                                          save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0,
                                          cache_hidden_states=cache))
    labels = np.array([p for line in paths[1].read_text().splitlines() for c in json.loads(line)["candidate_p_acc"]
                       for p in c])
    assert len(labels) == 8 * 10 * 3, "every candidate of every position is an example"
    constant = binary_kl(labels, np.full_like(labels, labels.mean()))
    learned = [log["eval_binary_kl"] for log in trainer.state.log_history if "eval_binary_kl" in log][-1]
    assert learned < 0.25 * constant


@pytest.mark.parametrize("model_args, records, message", [
    ({"head_features": ["none"]}, "with", "needs a proposer head with --head_features"),
    ({"head_alignment": "reader"}, "with", "needs a proposer head with --head_features"),
    ({}, "without", "12 of 16 records hold no candidates"),
])
def test_training_on_candidates_is_refused_where_it_cannot_work(pair_dirs, data_files, tmp_path, model_args, records,
                                                               message):
    with_candidates = tmp_path / "with.jsonl"
    with_candidates.write_text("".join(json.dumps(r | {"candidates": [[d] for d in r["draft"]],
                                                       "candidate_p_acc": [[p] for p in r["p_acc"]]}) + "\n"
                                       for r in synthetic_records(4)))
    files = (str(with_candidates), str(with_candidates)) if records == "with" else (data_files[0], str(with_candidates))
    with pytest.raises(ValueError, match=message):
        train(PairArguments(draft=pair_dirs[1]), ModelArguments(**model_args),
              DataArguments(records=files[0], eval_records=files[1], train_candidates=2),
              HeadTrainingArguments(output_dir=str(tmp_path / "o"), use_cpu=True))


def teacher_p_acc(draft, teacher: AcceptancePredictionHead, record: dict) -> list[float]:
    """The teacher's P(accept) for each drafted token, computed from the state that judges it: a
    proposer's at tokens[i-1] with draft[i]'s features there, a reader's at draft[i] of prefix + draft."""
    proposer = teacher.alignment == "proposer"
    ids = torch.tensor([record["prefix"] + (record["tokens"][:-1] if proposer else record["draft"])])
    with torch.no_grad():
        out = draft(ids, output_hidden_states=True)
    span = slice(len(record["prefix"]) - proposer, None)
    features = logit_features(out.logits[0, span], torch.tensor(record["draft"]), teacher.features) if proposer else None
    return teacher.accept_prob(out.hidden_states[-1][0, span], features).tolist()


@pytest.mark.parametrize("alignment", ["proposer", "reader"])
def test_head_learns_what_the_judging_state_determines(pair_dirs, tmp_path, alignment):
    # labels from a teacher head on the state that judges each drafted token: a student only fits
    # them if training pairs every label with exactly that state (and, for a proposer, its features)
    draft = load_model(pair_dirs[1])
    torch.manual_seed(0)
    features = ["log_q", "entropy"] if alignment == "proposer" else []
    teacher = AcceptancePredictionHead(32, 0, alignment=alignment, features=features)
    torch.nn.init.normal_(teacher.model[-1].weight)
    paths = []
    for name, seed, n in (("train", 0, 24), ("eval", 1, 8)):
        paths.append(tmp_path / f"{name}.jsonl")
        paths[-1].write_text("".join(json.dumps(r | {"p_acc": teacher_p_acc(draft, teacher, r)}) + "\n"
                                     for r in synthetic_records(n, seed)))
    trainer = train(PairArguments(draft=pair_dirs[1]), ModelArguments(resnet_num_layers=1, head_alignment=alignment),
                    DataArguments(records=str(paths[0]), eval_records=str(paths[1]), mixing_ratio=0.0),
                    HeadTrainingArguments(output_dir=str(tmp_path / "out"), num_train_epochs=10, learning_rate=5e-2,
                                          per_device_train_batch_size=4, weight_mismatch=1.0, report_to="none",
                                          save_strategy="no", use_cpu=True, disable_tqdm=True, cache_hidden_states=True))
    assert trainer.model.head.config == {"hidden_size": 32, "num_layers": 1, "alignment": alignment,
                                         **({"features": features} if features else {})}
    labels = np.array([p for line in paths[1].read_text().splitlines() for p in json.loads(line)["p_acc"]])
    constant = binary_kl(labels, np.full_like(labels, labels.mean()))
    learned = [log["eval_binary_kl"] for log in trainer.state.log_history if "eval_binary_kl" in log][-1]
    assert learned < 0.25 * constant


def test_only_the_head_is_saved_and_training_resumes(pair_dirs, data_files, tmp_path):
    trainer = run(pair_dirs, data_files, tmp_path / "full")
    head = AcceptancePredictionHead.from_pretrained(tmp_path / "full")
    assert (head.hidden_size, head.num_layers) == (32, 2)
    for key, value in head.state_dict().items():
        torch.testing.assert_close(value, trainer.model.head.state_dict()[key])
    assert set(load_file(tmp_path / "full" / "model.safetensors")) == set(head.state_dict())
    card = (tmp_path / "full" / "README.md").read_text()
    assert "tiny-target" in card and pair_dirs[1] in card and "eval_binary_kl" in card
    # 12 records / 4 per step = 3 steps an epoch; checkpoint-3 is the end of the first epoch
    first = AcceptancePredictionHead.from_pretrained(tmp_path / "full" / "checkpoint-3")
    assert not torch.equal(first.model[-1].weight, head.model[-1].weight)
    assert not any(torch.equal(b.linear.weight, torch.zeros_like(b.linear.weight)) for b in head.model[:-1])

    resumed_dir = tmp_path / "resumed"
    resumed_dir.mkdir()
    os.symlink(tmp_path / "full" / "checkpoint-3", resumed_dir / "checkpoint-3")
    # a later save interrupted after the head was written: no optimizer, scheduler or trainer state
    (resumed_dir / "checkpoint-5").mkdir()
    for name in ("config.json", "model.safetensors"):
        os.symlink(tmp_path / "full" / "checkpoint-6" / name, resumed_dir / "checkpoint-5" / name)
    run(pair_dirs, data_files, resumed_dir, resume_from_checkpoint="True")
    resumed = AcceptancePredictionHead.from_pretrained(resumed_dir)
    for key, value in head.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[key], value)


def complete_checkpoint(folder, *names: str) -> None:
    """A stand-in for a checkpoint folder holding `names` (default: all that Trainer writes)."""
    folder.mkdir(parents=True)
    for name in names or ("config.json", "model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth",
                          "trainer_state.json"):
        (folder / name).write_text("{}")


def test_resume_takes_the_latest_complete_checkpoint_and_says_what_it_skipped(tmp_path, capsys):
    complete_checkpoint(tmp_path / "checkpoint-3")
    complete_checkpoint(tmp_path / "checkpoint-20", "config.json", "model.safetensors", "trainer_state.json", "latest",
                        "global_step20")  # DeepSpeed keeps optimizer and scheduler in its global_step folder
    complete_checkpoint(tmp_path / "checkpoint-150", "config.json", "model.safetensors", "optimizer.pt")
    complete_checkpoint(tmp_path / "checkpoint-100", "config.json", "model.safetensors", "optimizer.pt", "scheduler.pt")
    assert latest_complete_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-20")
    assert capsys.readouterr().err.splitlines() == [
        f"skipping {tmp_path / 'checkpoint-150'}: incomplete, no scheduler.pt, trainer_state.json (its save was "
        "interrupted)",
        f"skipping {tmp_path / 'checkpoint-100'}: incomplete, no trainer_state.json (its save was interrupted)"]
    for name in ("checkpoint-20", "checkpoint-3"):
        (tmp_path / name / "trainer_state.json").unlink()
    with pytest.raises(ValueError, match="no complete checkpoint-\\* folder"):
        latest_complete_checkpoint(str(tmp_path))


def test_resuming_from_a_named_incomplete_checkpoint_is_refused_before_loading(pair_dirs, data_files, tmp_path):
    AcceptancePredictionHead(32, 2, alignment="proposer", features=["log_q", "entropy"]).save_pretrained(
        tmp_path / "checkpoint-7")
    with pytest.raises(ValueError, match="checkpoint-7 is incomplete, no optimizer.pt, scheduler.pt, trainer_state"):
        run(pair_dirs, data_files, tmp_path, resume_from_checkpoint=str(tmp_path / "checkpoint-7"))


def test_the_command_reports_bad_input_in_one_line(tmp_path):
    with pytest.raises(SystemExit) as exit_:
        main(["--output_dir", str(tmp_path), "--use_cpu", "True", "--report_to", "none"])
    assert exit_.value.code == "specdecpp train: error: --draft is required"


def test_resuming_a_head_of_another_draft_or_alignment_is_refused(pair_dirs, data_files, tmp_path):
    AcceptancePredictionHead(16, 2).save_pretrained(tmp_path / "checkpoint-5")
    with pytest.raises(ValueError, match="hidden size"):
        run(pair_dirs, data_files, tmp_path, resume_from_checkpoint=str(tmp_path / "checkpoint-5"))
    AcceptancePredictionHead(32, 2).save_pretrained(tmp_path / "checkpoint-6")  # a reader head
    with pytest.raises(ValueError, match="--head_alignment"):
        run(pair_dirs, data_files, tmp_path, resume_from_checkpoint=str(tmp_path / "checkpoint-6"))
    AcceptancePredictionHead(32, 2, alignment="proposer", features=["log_q", "entropy"], width=8).save_pretrained(
        tmp_path / "checkpoint-7")
    with pytest.raises(ValueError, match="--head_width"):
        run(pair_dirs, data_files, tmp_path, resume_from_checkpoint=str(tmp_path / "checkpoint-7"))


def test_a_head_of_narrower_blocks_trains_and_saves_its_width(pair_dirs, data_files, tmp_path):
    run(pair_dirs, data_files, tmp_path, width=4, save_strategy="no")
    head = AcceptancePredictionHead.from_pretrained(tmp_path)
    assert head.width == 4 and head.input_projection()[0].shape == (4, head.hidden_size + 2)


@pytest.mark.parametrize("alignment", ["proposer", "reader"])
def test_cached_hidden_states_train_the_same_head(pair_dirs, data_files, tmp_path, alignment):
    plain = run(pair_dirs, data_files, tmp_path / "plain", num_train_epochs=1, alignment=alignment).model.head
    cached = run(pair_dirs, data_files, tmp_path / "cached", num_train_epochs=1, cache_hidden_states=True,
                 alignment=alignment).model.head
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(cached.state_dict()[key], value, rtol=1e-4, atol=1e-5)
    assert not (tmp_path / "cached" / "hidden_states_cache").exists()


def test_bad_data_and_settings_fail_before_training(pair_dirs, data_files, tmp_path):
    bad = tmp_path / "bad.jsonl"
    record = synthetic_records(1)[0]
    bad.write_text(json.dumps(record | {"p_acc": record["p_acc"][:-1]}) + "\n")
    with pytest.raises(ValueError, match="different lengths"):
        run(pair_dirs, (str(bad), data_files[1]), tmp_path / "o")
    big = tmp_path / "big.jsonl"
    big.write_text(json.dumps(record | {"tokens": [99] * 10}) + "\n")
    with pytest.raises(ValueError, match="another tokenizer"):
        run(pair_dirs, (str(big), data_files[1]), tmp_path / "o")
    with pytest.raises(ValueError, match="mixing_ratio"):
        train(PairArguments(draft=pair_dirs[1]), ModelArguments(), DataArguments(records=data_files[0], mixing_ratio=1.0),
              HeadTrainingArguments(output_dir=str(tmp_path / "o"), use_cpu=True))


def test_report_to_wandb_offline(pair_dirs, data_files, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run(pair_dirs, data_files, tmp_path / "out", num_train_epochs=1, report_to="wandb", save_strategy="no")
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert runs and any(p.suffix == ".wandb" for p in runs[0].iterdir())


def torchrun_train(pair_dirs, data_files, out, *flags: str, timeout: int = 240, env: dict | None = None) -> None:
    """Run `torchrun --nproc_per_node 2 specdecpp/train.py` (one epoch, 2 per step, CPU) with extra `flags`
    and environment variables `env`."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "specdecpp/train.py", "--model_name_or_path", pair_dirs[1], "--data_path", data_files[0],
           "--eval_data_path", data_files[1], "--output_dir", str(out), "--resnet_num_layers", "2",
           "--num_train_epochs", "1", "--per_device_train_batch_size", "2", "--save_strategy", "epoch",
           "--report_to", "none", "--use_cpu", "True", "--weight_mismatch", "6", "--mixing_ratio", "0.15", *flags]
    env = os.environ | {"OMP_NUM_THREADS": "1"} | (env or {})
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow  # torchrun
def test_torchrun_two_ranks_train(pair_dirs, data_files, tmp_path):
    out = tmp_path / "head"
    torchrun_train(pair_dirs, data_files, out, "--cache_hidden_states")
    # 12 records, 2 ranks x 2 per step: 3 steps (one process would take 6)
    assert (out / "checkpoint-3").is_dir() and not (out / "checkpoint-6").exists()
    assert AcceptancePredictionHead.from_pretrained(out).hidden_size == 32


@pytest.mark.slow  # torchrun and DeepSpeed
def test_torchrun_two_ranks_deepspeed_zero2(pair_dirs, data_files, tmp_path):
    """The shipped ZeRO-2 config trains a head on the CPU under 2 ranks (DeepSpeed's CPU accelerator). DeepSpeed
    JIT-compiles its shared-memory communication op (about a minute on 2 cores) into a folder of this test's own:
    a build killed in the shared cache leaves a lock file that makes every later build wait forever."""
    pytest.importorskip("deepspeed")
    out = tmp_path / "head"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    torchrun_train(pair_dirs, data_files, out, "--deepspeed", os.path.join(root, "configs", "ds_zero2.json"),
                   timeout=540, env={"TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions")})
    head = AcceptancePredictionHead.from_pretrained(out)
    assert (head.hidden_size, head.num_layers) == (32, 2)
    set_seed(42)  # train.py's default seed: the head it started from
    fresh = AcceptancePredictionHead(head.config)
    assert fresh.model[-1].weight.shape == head.model[-1].weight.shape
    assert not torch.equal(head.model[-1].weight, fresh.model[-1].weight)  # trained, not the initial weights
    assert not any(torch.equal(b.linear.weight, torch.zeros_like(b.linear.weight)) for b in head.model[:-1])
    assert set(os.listdir(out / "checkpoint-3")) >= {"model.safetensors", "config.json", "global_step3"}
