"""The calibration report: metrics against hand computations, and the command end to end."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score
from test_train import synthetic_records

from specdecpp.calibration import report as calibration
from specdecpp.calibration.report import calibration_report, main, predict, rank_report, soft_auroc, unweight
from specdecpp.head.model import AcceptancePredictionHead
from specdecpp.head.objective import IGNORE, acceptance_loss
from specdecpp.models import load_model


def test_ece_brier_auroc_by_hand():
    labels = np.array([0.0, 1.0, 1.0, 0.0, 1.0])
    predictions = np.array([0.05, 0.15, 0.85, 0.95, 0.9])
    report = calibration_report(labels, predictions, num_bins=2)
    # bin [0, .5): preds .05 .15 (mean .1), labels 0 1 (mean .5); bin [.5, 1]: preds .85 .95 .9, labels 1 0 1
    expected_ece = 2 / 5 * abs(0.1 - 0.5) + 3 / 5 * abs(0.9 - 2 / 3)
    assert report["ece"] == pytest.approx(expected_ece)
    assert report["brier"] == pytest.approx(np.mean((predictions - labels) ** 2))
    assert report["auroc"] == pytest.approx(roc_auc_score(labels, predictions))
    assert [b["count"] for b in report["bins"]] == [2, 3]


def test_calibrated_predictions_have_zero_ece_and_soft_auroc_weighs_labels():
    rng = np.random.default_rng(0)
    p = rng.random(2000)
    assert calibration_report(p, p)["ece"] == pytest.approx(0.0, abs=1e-12)
    # a soft label 0.25 is an accept of weight .25 and a reject of weight .75 at the same score:
    # accepts (.2, w .25), (.9, w 1); rejects (.2, w .75), (.1, w 1); ties count one half
    soft = soft_auroc(np.array([0.25, 1.0, 0.0]), np.array([0.2, 0.9, 0.1]))
    by_hand = (0.25 * 0.75 * 0.5 + 0.25 * 1 + 1 * 0.75 + 1 * 1) / (1.25 * 1.75)
    assert soft == pytest.approx(by_hand)
    assert np.isnan(soft_auroc(np.ones(3), np.array([0.1, 0.5, 0.9])))


def test_predictions_match_the_head_on_the_draft(pair_dirs):
    draft = load_model(pair_dirs[1])
    head = AcceptancePredictionHead(32, 1)
    records = synthetic_records(3)
    labels, predictions = predict(head, draft, records, mixing_ratio=0.0, batch_size=2)
    assert labels.tolist() == [p for r in records for p in r["p_acc"]]
    r = records[1]
    with torch.no_grad():
        hidden = draft(torch.tensor([r["prefix"] + r["draft"]]), output_hidden_states=True).hidden_states[-1]
    expected = head.accept_prob(hidden)[0, len(r["prefix"]):]
    np.testing.assert_allclose(predictions[10:20], expected.numpy(), rtol=1e-5)
    with pytest.raises(ValueError, match="another draft"):
        predict(AcceptancePredictionHead(16, 1), draft, records)


def test_command_prints_report_and_writes_diagram(pair_dirs, tmp_path, capsys):
    AcceptancePredictionHead(32, 2).save_pretrained(tmp_path / "head")
    with open(tmp_path / "dev.jsonl", "w") as f:
        for r in synthetic_records(5):
            f.write(json.dumps(r) + "\n")
    main(["--head", str(tmp_path / "head"), "--draft", pair_dirs[1], "--data_path", str(tmp_path / "dev.jsonl"),
          "--plot_path", str(tmp_path / "rel.png"), "--output", str(tmp_path / "rel.json")])
    out = capsys.readouterr().out
    for name in ("ECE", "Brier score", "AUROC", "binary KL"):
        assert name in out
    assert (tmp_path / "rel.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "rel.json").read_text())["positions"] > 0


def test_rank_report_by_hand():
    labels = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, IGNORE], [1.0, 0.0, IGNORE], [0.0, 0.0, 1.0]])
    predictions = np.array([[0.9, 0.2, 0.1], [0.3, 0.6, 0.5], [0.8, 0.1, 0.5], [0.4, 0.3, 0.2]])
    report = rank_report(labels, predictions)
    assert list(report) == ["1", "2", "3", "2+", "all"]
    assert [report[k]["positions"] for k in report] == [4, 4, 2, 6, 10]
    assert report["1"]["mean_label"] == 0.5 and report["1"]["auroc"] == 1.0
    assert report["3"]["mean_prediction"] == pytest.approx(0.15) and report["2+"]["mean_label"] == pytest.approx(2 / 6)
    assert report["all"] == calibration_report(labels[labels != IGNORE], predictions[labels != IGNORE])


def with_candidates(record: dict) -> dict:
    """`record` with three candidates per position, the drafted token first, the drafted token's label first."""
    return record | {"candidates": [[d, (d + 1) % 60 + 4, (d + 2) % 60 + 4] for d in record["draft"]],
                     "candidate_p_acc": [[p, 1.0 - p, 0.0] for p in record["p_acc"]]}


@pytest.mark.parametrize("features", [[], ["log_q", "log_rank"]])
def test_the_command_reports_by_candidate_rank(pair_dirs, tmp_path, capsys, features):
    torch.manual_seed(0)
    head = AcceptancePredictionHead(32, 1, alignment="proposer", features=features)
    torch.nn.init.normal_(head.model[-1].weight)
    head.save_pretrained(tmp_path / "head")
    records = [with_candidates(r) for r in synthetic_records(4)]
    (tmp_path / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    main(["--head", str(tmp_path / "head"), "--draft", pair_dirs[1], "--data_path", str(tmp_path / "dev.jsonl"),
          "--plot_path", str(tmp_path / "rel.png"), "--rank_plot_path", str(tmp_path / "ranks.png"),
          "--output", str(tmp_path / "rel.json")])
    assert "by candidate rank" in capsys.readouterr().out
    assert (tmp_path / "ranks.png").read_bytes()[:4] == b"\x89PNG"
    report = json.loads((tmp_path / "rel.json").read_text())
    by_rank = report["by_rank"]
    assert [by_rank[k]["positions"] for k in ("1", "2", "3", "2+", "all")] == [40, 40, 40, 80, 120]
    assert by_rank["2"]["mean_label"] == 1 - by_rank["1"]["mean_label"] and by_rank["3"]["mean_label"] == 0
    for key in ("ece", "auroc", "mean_prediction"):
        assert by_rank["1"][key] == pytest.approx(report[key]), "rank 1 is the drafted token"
    labels, predictions = predict(head, load_model(pair_dirs[1]), records, num_candidates=3)
    assert labels.shape == predictions.shape == (40, 3) and (labels[:, 1] == 1 - labels[:, 0]).all()
    if features:
        assert (predictions[:, 0] != predictions[:, 1]).all(), "features tell a position's candidates apart"
    else:
        assert (predictions == predictions[:, :1]).all(), "a head of the hidden state alone scores siblings alike"


def test_records_without_candidates_have_no_rank_report(pair_dirs, tmp_path):
    AcceptancePredictionHead(32, 1, alignment="proposer").save_pretrained(tmp_path / "head")
    (tmp_path / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in synthetic_records(2)))
    main(["--head", str(tmp_path / "head"), "--draft", pair_dirs[1], "--data_path", str(tmp_path / "dev.jsonl"),
          "--plot_path", str(tmp_path / "rel.png"), "--rank_plot_path", str(tmp_path / "ranks.png"),
          "--output", str(tmp_path / "rel.json")])
    assert "by_rank" not in json.loads((tmp_path / "rel.json").read_text())
    assert not (tmp_path / "ranks.png").exists()


@pytest.fixture
def no_scoring(monkeypatch):
    """Fail the test if records are scored or a model (draft or target) is loaded."""
    def refuse(*args, **kwargs):
        raise AssertionError("records were scored or a model loaded before the input was checked")

    monkeypatch.setattr(calibration, "predict", refuse)
    monkeypatch.setattr(calibration, "load_model", refuse)


def test_a_reader_head_is_refused_for_choosing_a_threshold_before_any_scoring(pair_dirs, tmp_path, no_scoring):
    AcceptancePredictionHead(32, 2).save_pretrained(tmp_path / "head")  # no alignment: a reader head
    (tmp_path / "dev.jsonl").write_text(json.dumps(synthetic_records(1)[0]) + "\n")
    with pytest.raises(SystemExit) as exit_:
        main(["--head", str(tmp_path / "head"), "--draft", pair_dirs[1], "--data_path", str(tmp_path / "dev.jsonl"),
              "--plot_path", str(tmp_path / "rel.png"), "--choose_threshold", "--target", pair_dirs[0]])
    assert exit_.value.code.startswith(f"specdecpp calibration: error: --choose_threshold needs a proposer head, "
                                       f"and {tmp_path / 'head'} is a reader head")


@pytest.mark.parametrize("flag", ["--plot_path", "--output"])
def test_an_output_in_a_missing_folder_is_refused_before_any_scoring(pair_dirs, tmp_path, no_scoring, monkeypatch,
                                                                     flag):
    monkeypatch.setattr(calibration, "read_records", lambda path: pytest.fail("the records were read"))
    missing = tmp_path / "no" / "such" / "out.png"
    with pytest.raises(SystemExit) as exit_:
        main(["--head", str(tmp_path / "head"), "--draft", pair_dirs[1], "--data_path", "dev.jsonl", flag, str(missing)])
    assert exit_.value.code == (f"specdecpp calibration: error: {flag} {missing}: no folder {missing.parent}; create "
                                "it or choose another path")


def test_the_steps_are_timed_with_the_threads_decoding_will_use(pair_dirs, tmp_path, monkeypatch):
    assert calibration.CalibrationArguments(records="r").threads == 1  # as evaluate and the demo decode in the recipe
    seen = []

    def timing(*args, **kwargs):
        seen.append(torch.get_num_threads())
        raise ValueError("timed")

    monkeypatch.setattr(calibration, "choose_threshold", timing)
    AcceptancePredictionHead(32, 2, alignment="proposer").save_pretrained(tmp_path / "head")
    (tmp_path / "dev.jsonl").write_text(json.dumps(synthetic_records(1)[0]) + "\n")
    before = torch.get_num_threads()
    with pytest.raises(SystemExit, match="timed"):
        main(["--head", str(tmp_path / "head"), "--draft", pair_dirs[1], "--target", pair_dirs[0], "--data_path",
              str(tmp_path / "dev.jsonl"), "--plot_path", str(tmp_path / "rel.png"), "--choose_threshold",
              "--threads", "2"])
    assert seen == [2] and torch.get_num_threads() == before  # set while timing, then set back


def test_unweight_inverts_the_weighted_optimum():
    # the weighted BCE with weight w is minimised at s = y / (y + w (1 - y)); unweight maps it back to y
    y, w = np.array([0.0, 0.1, 0.5, 0.9, 1.0]), 6.0
    s = y / (y + w * (1 - y))
    np.testing.assert_allclose(unweight(s, w), y)
    np.testing.assert_allclose(unweight(s, 1.0), s)
    logits = torch.zeros(5, 2, requires_grad=True)  # and it is the loss's minimum, found numerically
    optimizer = torch.optim.Adam([logits], lr=0.05)
    for _ in range(1500):
        optimizer.zero_grad()
        sum(acceptance_loss(logits[i: i + 1], torch.tensor([y[i]]), w) for i in range(5)).backward()
        optimizer.step()
    np.testing.assert_allclose(logits.softmax(-1)[:, 1].detach().numpy(), s, atol=2e-3)
