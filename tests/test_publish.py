"""Publishing heads: what is handed to huggingface_hub (the exact files), from `push_head`, from
`specdecpp push` and from `train.py --push_to_hub`, and the model card. Offline: `HfApi.create_repo` and
`HfApi.upload_folder` are replaced by recorders, so everything up to the upload boundary runs."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from huggingface_hub import HfApi
from test_train import data_files, run  # noqa: F401  (data_files is a fixture)

from specdecpp import cli
from specdecpp.head.folder import CUSTOM_GENERATE_FILES, card_facts, render_card
from specdecpp.head.model import AcceptancePredictionHead
from specdecpp.head.publish import push_head, stage_head

ZOO_HEAD = Path(__file__).resolve().parent.parent / "checkpoints" / "zoo" / "head"
HEAD_FILES = {"README.md", "config.json", "model.safetensors", *CUSTOM_GENERATE_FILES}
NEVER = {"training_args.bin", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"}


@pytest.fixture
def hub(monkeypatch):
    """Record `create_repo` and `upload_folder` calls (the files of the folder, its card, whether it loads as
    a head) instead of reaching the Hub."""
    calls = {"create_repo": [], "upload_folder": []}

    def create_repo(self, repo_id, **kwargs):
        calls["create_repo"].append({"repo_id": repo_id, **kwargs})
        return SimpleNamespace(repo_id=repo_id)

    def upload_folder(self, *, repo_id, folder_path, **kwargs):
        folder = Path(folder_path)
        calls["upload_folder"].append({
            "repo_id": repo_id, **kwargs, "folder": str(folder),
            "files": sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()),
            "card": (folder / "README.md").read_text(), "head": AcceptancePredictionHead.from_pretrained(folder)})
        return SimpleNamespace(commit_url=f"https://example.invalid/{repo_id}/commit/0")

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return calls


def trained_folder(root: Path) -> tuple[Path, AcceptancePredictionHead]:
    """A head folder as training and calibration leave it: the head, a stored threshold, a calibration
    report and diagram, and what must never be published (Trainer state, a checkpoint, a draft's weights)."""
    torch.manual_seed(0)
    head = AcceptancePredictionHead(16, 2)
    for p in head.parameters():
        torch.nn.init.normal_(p)
    folder = root / "head"
    head.save_pretrained(folder, model_card_kwargs={"draft": "tiny-draft", "target": "tiny-target",
                                                    "training_data": "train.jsonl", "eval_metrics": {"eval_binary_kl": 0.4}})
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"stop_threshold": 0.65}))
    (folder / "calibration.json").write_text(json.dumps({"positions": 100, "ece": 0.0312345, "auroc": 0.81, "bins": []}))
    (folder / "reliability.png").write_bytes(b"\x89PNG")
    for name in NEVER:
        (folder / name).write_bytes(b"x")
    for sub in ("checkpoint-3", "hidden_states_cache", "draft"):
        (folder / sub).mkdir()
        (folder / sub / "model.safetensors").write_bytes(b"x")
    return folder, head


def test_push_hands_over_the_head_files_only(tmp_path, hub):
    folder, head = trained_folder(tmp_path)
    push_head(folder, "me/acchead", private=True)
    assert hub["create_repo"] == [{"repo_id": "me/acchead", "private": True, "exist_ok": True, "repo_type": "model"}]
    (upload,) = hub["upload_folder"]
    assert upload["repo_id"] == "me/acchead"
    assert upload["files"] == sorted(HEAD_FILES | {"card.json", "calibration.json", "reliability.png"})
    for key, value in head.state_dict().items():
        torch.testing.assert_close(upload["head"].state_dict()[key], value)
    card = upload["card"]
    assert "tiny-draft" in card and "tiny-target" in card and "train.jsonl" in card and "eval_binary_kl" in card
    assert "Stored threshold: 0.65" in card and "0.0312" in card and "![reliability.png](reliability.png)" in card
    assert 'custom_generate="me/acchead"' in card and "this-repo-or-folder" not in card
    assert not (folder / "README.md").read_text().count("0.0312")  # the folder itself is left as it was


def test_the_push_command(tmp_path, hub, capsys):
    folder, _ = trained_folder(tmp_path)
    cli.main(["push", str(folder), "me/acchead", "--dry_run"])
    listed = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("Loading weights")]
    assert set(listed) == HEAD_FILES | {"card.json", "calibration.json", "reliability.png"} and not hub["upload_folder"]
    cli.main(["push", str(folder), "me/acchead"])
    assert hub["create_repo"][0]["private"] is False and hub["upload_folder"][0]["files"] == sorted(listed)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["push", str(tmp_path), "me/acchead"])
    assert exit_.value.code == f"specdecpp push: error: {tmp_path} is not a head folder (no config.json)"


@pytest.mark.parametrize("dry_run", [["--dry_run"], []])
def test_pushing_a_folder_that_is_not_a_head_says_so_and_creates_no_repo(pair_dirs, tmp_path, hub, dry_run):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["push", pair_dirs[0], "me/acchead", *dry_run])
    assert exit_.value.code.startswith(f"specdecpp push: error: {pair_dirs[0]} is not a head folder: its config.json "
                                       "is a llama model's")
    assert not hub["create_repo"] and not hub["upload_folder"]


def test_the_published_card_is_rendered_from_the_folder(tmp_path):
    files = stage_head(ZOO_HEAD, tmp_path, "me/zoo-head")
    assert set(files) >= HEAD_FILES | {"card.json", "reliability.png"}
    card = (tmp_path / "README.md").read_text()
    assert card == render_card(json.loads((ZOO_HEAD / "config.json").read_text()), card_facts(ZOO_HEAD), "me/zoo-head")
    config = json.loads((ZOO_HEAD / "config.json").read_text())
    assert f"Stored threshold: {config['stop_threshold']}" in card and card.count("## Use from transformers") == 1
    assert f"bound={tuple(config['threshold_selection']['bound'])}" in card  # the bound it was chosen for
    assert 'custom_generate="me/zoo-head"' in card and "this-repo-or-folder" not in card


def test_train_push_to_hub_publishes_only_the_head(pair_dirs, data_files, tmp_path, hub):  # noqa: F811
    out = tmp_path / "out"
    run(pair_dirs, data_files, out, num_train_epochs=1, save_strategy="epoch", push_to_hub=True,
        hub_model_id="me/tiny-head", hub_private_repo=True)
    assert hub["upload_folder"], "nothing was pushed"
    for upload in hub["upload_folder"]:
        assert upload["repo_id"] == "me/tiny-head"
        assert HEAD_FILES <= set(upload["files"]) <= HEAD_FILES | {"calibration.json", "card.json"}
    final = hub["upload_folder"][-1]
    assert final["commit_message"] == "Model save" and "tiny-target" in final["card"]
    assert torch.equal(final["head"].model[-1].weight,
                       AcceptancePredictionHead.from_pretrained(out).model[-1].weight)
    assert (out / "training_args.bin").exists()  # it exists and still was not published
    assert all((out / name).read_text() == text for name, text in CUSTOM_GENERATE_FILES.items())  # train.py's folder
