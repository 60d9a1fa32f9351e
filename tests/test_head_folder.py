"""The model card, rendered in one place from a head folder's config and files, and the import
boundary that keeps the head, training and publishing away from the decoding engine."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from specdecpp.costs import FLAT_COST, MEASURED_COST, StepTimes
from specdecpp.head.folder import card_facts, record_card_facts, render_card, write_card
from specdecpp.head.model import AcceptancePredictionHead

ROOT = Path(__file__).resolve().parent.parent
ZOO_HEAD = ROOT / "checkpoints" / "zoo" / "head"


def selection(mode: str = "greedy") -> dict:
    """A threshold selection as `specdecpp.calibration.threshold.choose_threshold` stores it, on flat step times."""
    return {"records": 2, "data": "dev.jsonl", "tokens": 40, "bound": [1, 20], "mode": mode,
            "step_times": StepTimes([1.0] * 20, [10.0] * 21, 10.0).as_dict(),
            "judged_step_times": StepTimes([1.1] * 20, [10.0] * 21, 10.0, judge_ms=0.1).as_dict(),
            "thresholds": [0.25, 0.5], "cost_per_token": [0.9, 1.0], "constant_k_cost_per_token": {"1": 0.95},
            "dynamic_cost_per_token": {"0.4": 0.93}, "oracle_cost_per_token": 0.5 if mode == "greedy" else None,
            "calls_per_token": {"ada@0.25": [0.5, 2.0], "ada@0.5": [0.4, 3.0], "K=1": [0.6, 0.6]}}


def test_the_card_renders_from_the_config_and_the_folder_files(tmp_path):
    head = AcceptancePredictionHead(8, 1, alignment="proposer", features=["log_q"])
    head.save_pretrained(tmp_path, model_card_kwargs={"draft": "org/draft", "target": "org/target",
                                                      "training_data": "train.jsonl",
                                                      "eval_metrics": {"eval_binary_kl": 0.25}})
    card = (tmp_path / "README.md").read_text()
    assert "org/draft" in card and "train.jsonl" in card and "| eval_binary_kl | 0.25 |" in card
    assert "`proposer` alignment, 1 residual blocks" in card and "logit features: log_q" in card
    assert "## Stop threshold" not in card and "head=head)" in card

    # calibration leaves a report and a diagram, then stores a threshold: saving re-renders the card
    (tmp_path / "calibration.json").write_text(json.dumps({"positions": 100, "ece": 0.0312345, "bins": []}))
    (tmp_path / "reliability.png").write_bytes(b"\x89PNG")
    head.with_threshold(0.25, selection()).save_pretrained(tmp_path)
    card = (tmp_path / "README.md").read_text()
    assert "org/target" in card and "| eval_binary_kl | 0.25 |" in card  # the facts stayed in card.json
    assert "Stored threshold: 0.25" in card and "| calibration | 100 | 0.0312 |" in card
    assert "![reliability.png](reliability.png)" in card
    assert f"| threshold | {MEASURED_COST} | {FLAT_COST} |" in card
    # flat step times: c = 1 / 10, so the flat view is target calls + 0.1 x draft calls per token
    assert "| 0.25 | 0.900 | 0.700 |" in card and "| 0.5 | 1.000 | 0.700 |" in card
    assert "K=1 0.950" in card and "our dynamic (draft confidence): 0.4 0.930" in card and "oracle 0.500" in card
    assert card.count('stop_threshold="auto", bound=(1, 20))') == 2 and "do_sample" not in card

    before = card
    assert write_card(tmp_path).read_text() == before  # rendering again changes nothing
    assert render_card(json.loads((tmp_path / "config.json").read_text()), card_facts(tmp_path)) == before


def test_a_threshold_chosen_on_sampled_records_gets_sampling_examples(tmp_path):
    AcceptancePredictionHead(8, 1, alignment="proposer", stop_threshold=0.5,
                             threshold_selection=selection("sampling")).save_pretrained(tmp_path)
    card = (tmp_path / "README.md").read_text()
    assert card.count('stop_threshold="auto", bound=(1, 20), do_sample=True)') == 2
    assert "sampled rounds" in card and "oracle" not in card


def test_the_card_says_when_the_machine_was_busy_while_the_steps_were_timed():
    config = {"hidden_size": 8, "num_layers": 1, "alignment": "proposer", "stop_threshold": 0.25,
              "threshold_selection": selection()}
    quiet = render_card(config, {})
    assert "busy" not in quiet and "fitted over lengths" not in quiet  # times stored before the fit: no claim
    busy = StepTimes([1.0] * 20, [10.0] * 21, 10.0, verify_ms_measured=[10.0] * 21, spread=0.4, busy=True)
    config["threshold_selection"]["step_times"] = busy.as_dict()
    card = render_card(config, {})
    assert "**The machine was busy while these steps were timed**: the timing passes spread by 40% (above 25%)" in card
    assert "pass `--step_times_from`" in card and "10.00 / 10.00 ms (fitted over lengths, one slow length ignored)" in card


def test_the_card_says_whether_the_steps_were_timed_or_given_prices():
    config = {"hidden_size": 8, "num_layers": 1, "alignment": "proposer", "stop_threshold": 0.25,
              "threshold_selection": selection()}
    assert "with given prices (cpu), not timed on this machine" in render_card(config, {})  # repeats 0
    for times in ("step_times", "judged_step_times"):
        config["threshold_selection"][times]["repeats"] = 16
    assert "measured through the eager engine's own steps on cpu with 1 torch thread(s), 16 timed passes" in \
        render_card(config, {})


def test_facts_merge_and_the_repo_id_goes_into_the_examples(tmp_path):
    AcceptancePredictionHead(8, 1).save_pretrained(tmp_path)
    record_card_facts(tmp_path, {"draft": "a"})
    record_card_facts(tmp_path, {"target": "b"})
    assert json.loads((tmp_path / "card.json").read_text()) == {"draft": "a", "target": "b"}
    card = write_card(tmp_path, "me/head").read_text()
    assert 'custom_generate="me/head"' in card and 'from_pretrained("me/head")' in card
    assert 'from_pretrained("b")' in card


def test_the_committed_zoo_head_renders_its_facts():
    card = render_card(json.loads((ZOO_HEAD / "config.json").read_text()), card_facts(ZOO_HEAD))
    config = json.loads((ZOO_HEAD / "config.json").read_text())
    assert f"Stored threshold: {config['stop_threshold']:g}" in card and "checkpoints/zoo/draft" in card
    assert "| calibration | 19200 |" in card and "![threshold.png](threshold.png)" in card


def test_no_card_is_edited_as_text():
    """The card is rendered, never patched: no regular expression touches a README anywhere."""
    for path in (ROOT / "specdecpp").rglob("*.py"):
        text = path.read_text()
        assert "README" not in text or "re.sub" not in text and ".partition(" not in text, path


def test_the_head_training_and_publishing_do_not_import_the_decoder():
    """One fresh interpreter: import each module in turn and look for the engine after each."""
    modules = ["specdecpp.costs", "specdecpp.head.folder", "specdecpp.head.model", "specdecpp.head.publish", "specdecpp.train"]
    code = ("import importlib, sys\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            "    print(name, 'specdecpp.engine.decoding' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert result.stdout.split() == [word for name in modules for word in (name, "False")]
