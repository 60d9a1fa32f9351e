"""The demo: K, confidence and thresholds chosen on tuning prompts only, then seven methods on the others."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import write_prompts

from specdecpp.costs import FLAT_COST
from specdecpp.evaluation import demo
from specdecpp.evaluation import arguments
from specdecpp.head.model import AcceptancePredictionHead


@pytest.fixture(scope="module")
def demo_dirs(pair_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("demo")
    torch.manual_seed(0)
    hidden = json.loads((Path(pair_dirs[1]) / "config.json").read_text())["hidden_size"]
    head = AcceptancePredictionHead(hidden_size=hidden, num_layers=1, alignment="proposer", features=["log_q"])
    head.with_threshold(0.5, {}).save_pretrained(root / "head")
    return {"target": pair_dirs[0], "draft": pair_dirs[1], "head": str(root / "head"),
            "prompts": write_prompts(root / "prompts.jsonl", 6), "out": root / "out"}


def flags(dirs, *extra: str) -> list[str]:
    return ["--model_name", dirs["target"], "--assistant_name", dirs["draft"], "--assist_acc_head_dir", dirs["head"],
            "--data_path", dirs["prompts"], "--save_path", str(dirs["out"]), "--max_new_tokens", "8",
            "--no_progress", "--threads", "0", *extra]  # 0: leave the test session's threads alone


def test_demo_tunes_on_other_prompts_then_prints_seven_methods(demo_dirs, capsys):
    demo.main(flags(demo_dirs, "--num_prompts", "2", "--tune_prompts", "2", "--constant_ks", "1", "3",
                    "--confidence_thresholds", "0.4", "0.6", "--stop_threshold", "0.2", "0.9",
                    "--online_thresholds", "0.3", "0.7"))
    out = capsys.readouterr().out
    summary = json.loads((demo_dirs["out"] / "summary.json").read_text())
    methods = [row["method"] for row in summary["summary"]]
    assert methods[:2] == ["target", "hf:dynamic"]
    assert methods[2].startswith("specdecpp:constant@K=") and methods[3].startswith("specdecpp:dynamic@")
    assert methods[4].startswith("specdecpp:online@") and methods[5].startswith("specdecpp:ada@")
    tuning = summary["tuning_summary"]
    assert [row["method"] for row in tuning] == ["target", "specdecpp:constant@K=1", "specdecpp:constant@K=3",
                                                 "specdecpp:dynamic@0.4", "specdecpp:dynamic@0.6",
                                                 "specdecpp:online@0.3", "specdecpp:online@0.7",
                                                 "specdecpp:ada@0.2", "specdecpp:ada@0.9",
                                                 "specdecpp:ada-tree@0.2,nodes=16", "specdecpp:ada-tree@0.9,nodes=16"]
    for schedule, chosen in (("constant", methods[2]), ("dynamic", methods[3]), ("online", methods[4]),
                             ("ada", methods[5]), ("ada-tree", methods[6])):
        rows = [row for row in tuning if row["schedule"] == schedule]
        assert chosen == min(rows, key=lambda row: row["cost_per_token"])["method"]
    records = json.loads((demo_dirs["out"] / "results_2to4.json").read_text())
    assert sorted({r["id"] for r in records}) == [2, 3]  # the tuning prompts 0 and 1 are not scored
    assert f"chosen by the lowest {FLAT_COST}" in summary["chosen"] and "0-1" in summary["chosen"]
    assert summary["greedy_check"].startswith("greedy check passed")
    for line in (summary["table"], summary["chosen"], summary["greedy_check"], f"SpecDec++ ({methods[5]}): {FLAT_COST} ",
                 "against our dynamic at its best confidence", f"against vLLM's online estimator ({methods[4]}, ",
                 f"The head's token tree ({methods[6]}): "):
        assert line in out


def test_the_stored_threshold_needs_no_tuning(demo_dirs):
    demo.main(flags(demo_dirs, "--num_prompts", "2", "--tune_prompts", "1", "--constant_ks", "2",
                    "--confidence_thresholds", "0.4"))
    summary = json.loads((demo_dirs["out"] / "summary.json").read_text())
    ada = summary["summary"][5]
    assert ada["method"] == "specdecpp:ada@auto" and ada["stop_threshold"] == 0.5
    assert summary["tuning_summary"] == [] and "ada threshold = auto" in summary["chosen"]


def test_several_candidates_without_tuning_prompts_is_refused(demo_dirs):
    with pytest.raises(SystemExit, match="needs --tune_prompts >= 1"):
        demo.main(flags(demo_dirs, "--tune_prompts", "0"))


def test_a_missing_pair_is_named(demo_dirs, tmp_path):
    with pytest.raises(SystemExit, match="no model folder at /no/such/target"):
        demo.main(flags(demo_dirs) + ["--model_name", "/no/such/target"])


def test_too_few_prompts_is_refused_before_loading_a_model(demo_dirs, monkeypatch):
    monkeypatch.setattr(arguments, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit, match="has only 6 prompts; need more than --tune_prompts 6"):
        demo.main(flags(demo_dirs, "--tune_prompts", "6", "--num_prompts", "1"))


def test_outside_a_checkout_the_demo_says_where_the_pair_is_expected(demo_dirs, tmp_path, monkeypatch):
    zoo = tmp_path / "checkpoints" / "zoo"
    monkeypatch.setattr(arguments, "ZOO_DIR", zoo)
    with pytest.raises(SystemExit, match=r"expected in .*--target TARGET --draft DRAFT"):
        demo.main(flags(demo_dirs) + ["--model_name", str(zoo / "target"), "--assistant_name", str(zoo / "draft")])
