"""Evaluation: flags -> methods, bad input refused before loading, Hugging Face's baselines
counted like our engine, and a whole run's records, summary and figures."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import types
from dataclasses import fields
from pathlib import Path

import pytest
import torch
from conftest import write_prompts

from specdecpp import evaluate as ev
from specdecpp.engine import compiled, schedules
from specdecpp.evaluation import arguments, methods, runner
from specdecpp.head.model import AcceptancePredictionHead

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def eval_dirs(pair_dirs, tmp_path_factory):
    """The tiny pair on disk plus an (untrained) head for its draft, a head for a draft of another
    hidden size, and a prompt file."""
    root = tmp_path_factory.mktemp("eval")
    torch.manual_seed(0)
    hidden = json.loads((Path(pair_dirs[1]) / "config.json").read_text())["hidden_size"]
    AcceptancePredictionHead(hidden_size=hidden, num_layers=1).save_pretrained(root / "head")
    AcceptancePredictionHead(hidden_size=hidden + 16, num_layers=1).save_pretrained(root / "head_other")
    return {"target": pair_dirs[0], "draft": pair_dirs[1], "head": str(root / "head"),
            "head_other": str(root / "head_other"), "prompts": write_prompts(root / "prompts.jsonl", 4)}


class Run(types.SimpleNamespace):
    """An evaluation's values (pair, method grid, decoding, prompt source, run options), by kind."""

    def evaluate(self) -> dict:
        return ev.evaluate(self.pair, self.grid, self.decoding.settings(), self.source, self.run)


def make_args(dirs, tmp_path, **overrides) -> Run:
    """The values of an evaluation of the tiny pair, each setting overridden by its flag's name."""
    settings = dict(target=dirs["target"], draft=dirs["draft"], head=[dirs["head"]], prompts=dirs["prompts"],
                    output=str(tmp_path / "out"), max_new_tokens=10, cost_steps_per_prompt=2, warmup_tokens=4,
                    progress=False) | overrides
    kinds = (ev.HeadPairArguments, ev.MethodGrid, ev.DecodingArguments, ev.PromptSource, ev.RunOptions)
    values = [cls(**{f.name: settings.pop(f.name) for f in fields(cls) if f.name in settings}) for cls in kinds]
    assert not settings, f"no such setting: {settings}"
    return Run(**dict(zip(("pair", "grid", "decoding", "source", "run"), values)))


# -- flags -> methods ---------------------------------------------------------------------------
def test_flags_give_one_method_per_schedule_and_knob_value():
    pair, grid, *_ = ev.parse_args(["--num_assistant_tokens_schedule", "constant", "ada", "heuristic", "dynamic",
                                    "--num_assistant_tokens", "2", "4", "--stop_threshold", "0.1", "0.5",
                                    "--baselines", "target", "hf:heuristic", "hf:dynamic", "--head", "heads/v2"])
    names = [spec.name for spec in ev.method_specs(grid, pair.head)]
    assert names == ["target", "hf:heuristic@K=2", "hf:dynamic", "specdecpp:constant@K=2", "specdecpp:constant@K=4",
                     "specdecpp:ada@0.1", "specdecpp:ada@0.5", "specdecpp:heuristic@K=2", "specdecpp:dynamic"]


def test_several_heads_thresholds_and_confidences_are_methods_of_their_own():
    pair, grid, *_ = ev.parse_args(["--schedule", "ada", "dynamic", "--assist_acc_head_dir", "heads/v2",
                                    "heads/reference", "--stop_threshold", "0.5", "auto",
                                    "--assistant_confidence_threshold", "0.2", "0.6", "--baselines", "target",
                                    "hf:dynamic"])
    specs = ev.method_specs(grid, pair.head)
    assert [spec.name for spec in specs] == [
        "target", "hf:dynamic", "specdecpp:ada[v2]@0.5", "specdecpp:ada[v2]@auto", "specdecpp:ada[reference]@0.5",
        "specdecpp:ada[reference]@auto", "specdecpp:dynamic@0.2", "specdecpp:dynamic@0.6"]
    assert [spec.head for spec in specs[2:6]] == ["heads/v2"] * 2 + ["heads/reference"] * 2
    assert specs[1].assistant_confidence_threshold == 0.2 and specs[3].stop_threshold == "auto"


def test_online_and_recalibrated_ada_are_methods_of_their_own():
    pair, grid, *_ = ev.parse_args(["--schedule", "ada", "online", "--stop_threshold", "auto", "--online",
                                    "--online_threshold", "0.4", "0.6", "--baselines", "target", "--head", "heads/v2"])
    specs = ev.method_specs(grid, pair.head)
    assert [spec.name for spec in specs] == ["target", "specdecpp:ada@auto", "specdecpp:ada-online@auto",
                                             "specdecpp:online@0.4", "specdecpp:online@0.6"]
    assert [spec.online for spec in specs] == [False, False, True, False, False]
    assert specs[3].stop_threshold == 0.4 and specs[3].schedule == "online"


def test_online_methods_learn_over_the_evaluated_prompts_in_order(eval_dirs, tmp_path, monkeypatch):
    """One estimator per method: it learns over every evaluated prompt, and what the warm-up taught
    it is forgotten (`Method.restart`); the outputs still equal the target's."""
    made = []

    class Estimator(schedules.OnlineAcceptanceEstimator):
        def __post_init__(self):
            super().__post_init__()
            made.append(self)

    monkeypatch.setattr(schedules, "OnlineAcceptanceEstimator", Estimator)  # where schedules make their cold starts
    args = make_args(eval_dirs, tmp_path, schedule=["ada", "online"], stop_threshold=[0.5], online=True,
                     online_threshold=[0.4], baselines=["target"], n_end=3, bound=[1, 6])
    document = args.evaluate()
    assert document["greedy_check"].startswith("greedy check passed")
    records = json.loads((Path(args.run.output) / "results_0to3.json").read_text())
    for name in ("specdecpp:ada-online@0.5", "specdecpp:online@0.4"):
        rounds = sum(r["num_LM_call"] for r in records if r["method"] == name)
        learning = [estimator for estimator in made if estimator.steps == rounds]
        assert len(learning) == 1 and learning[0].num_positions == 6, name
    assert len(made) == 4  # each: one made with its method, one after the warm-up


def test_budget_methods_run_per_block_with_the_step_times_stored_in_the_head(eval_dirs, tmp_path):
    """verify-budget and ada-budget are one method per K, priced with the step times the head's
    threshold selection stores (judged ones for ada-budget), and their output is the target's."""
    from test_decoding import BUDGET_TIMES, random_proposer

    head_dir = tmp_path / "proposer"
    hidden = json.loads((Path(eval_dirs["draft"]) / "config.json").read_text())["hidden_size"]
    random_proposer(hidden).with_threshold(0.5, {"step_times": BUDGET_TIMES.as_dict(),
                                                 "judged_step_times": BUDGET_TIMES.as_dict()}).save_pretrained(head_dir)
    args = make_args(eval_dirs, tmp_path, schedule=["verify-budget", "ada-budget"], num_assistant_tokens=[2, 4],
                     head=[str(head_dir)], baselines=["target"], n_end=2)
    specs = methods.method_specs(args.grid, args.pair.head)
    assert [spec.name for spec in specs] == ["target", "specdecpp:verify-budget@K=2", "specdecpp:verify-budget@K=4",
                                             "specdecpp:ada-budget@K=2", "specdecpp:ada-budget@K=4"]
    assert specs[1].step_times_from == str(head_dir) and specs[3].step_times_from is None  # ada-budget: its head's
    assert methods.method_settings(specs[1], None, args.decoding.settings()).step_times == BUDGET_TIMES
    document = args.evaluate()
    assert document["greedy_check"].startswith("greedy check passed")
    records = json.loads((Path(args.run.output) / "results_0to2.json").read_text())
    assert {r["method"] for r in records} == {spec.name for spec in specs}
    for r in records:
        if r["schedule"] in ("verify-budget", "ada-budget"):  # unverified drafts are discarded too
            assert r["num_mismatched_tokens"] > 0


def test_target_alone_always_runs_and_none_means_baselines_only():
    pair, grid, *_ = ev.parse_args(["--schedule", "none", "--baselines", "draft"])
    assert [spec.name for spec in ev.method_specs(grid, pair.head)] == ["target", "draft"]


def test_hf_settings_turn_the_confidence_stop_off_except_for_dynamic():
    grid = ev.MethodGrid(assistant_confidence_threshold=[0.25, 0.5])
    constant, dynamic = (methods._knob_specs("hf", schedule, grid, [])[0] for schedule in ("constant", "dynamic"))
    assert ev.hf_assistant_settings(constant) == {
        "num_assistant_tokens": 5, "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0}
    assert ev.hf_assistant_settings(dynamic) == {
        "num_assistant_tokens": 20, "num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.25}
    with pytest.raises(ValueError, match="no 'ada' schedule"):
        ev.hf_assistant_settings(ev.MethodSpec("hf:ada", "hf", "ada"))


# -- bad input: a clear error, before any model is loaded ---------------------------------------
@pytest.fixture
def no_model_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(arguments, "load_model", refuse)


@pytest.mark.parametrize("overrides, error, message", [
    (dict(bound=[20, 2]), ValueError, r"--bound must be \(min, max\)"),
    (dict(bound=[2]), ValueError, r"--bound must be \(min, max\)"),
    (dict(num_assistant_tokens=[3, 0]), ValueError, "--num_assistant_tokens must be >= 1"),
    (dict(dynamic_num_assistant_tokens=0), ValueError, "--dynamic_num_assistant_tokens must be >= 1"),
    (dict(assistant_confidence_threshold=[1.5]), ValueError, r"--assistant_confidence_threshold must be in \[0, 1\]"),
    (dict(prompts="no-such-set"), ValueError, "unknown prompt set 'no-such-set'"),
    (dict(prompts="missing/prompts.jsonl"), FileNotFoundError, "no prompt file"),
    (dict(head=["HEAD_OTHER"]), ValueError, "trained for another draft"),
    (dict(head=["/no/such/head"]), FileNotFoundError, "no head folder"),
    (dict(stop_threshold=["auto"]), ValueError, "has one"),
    (dict(stop_threshold=["high"]), ValueError, "--stop_threshold"),
    (dict(draft="/no/such/draft"), FileNotFoundError, "no model folder"),
    (dict(schedule=["oracle"], do_sample=True), ValueError, "greedy decoding only"),
    (dict(schedule=["verify-budget"], do_sample=True), ValueError, "greedy decoding only"),
    (dict(schedule=["verify-budget"]), ValueError, "--step_times_from"),
])
def test_bad_input_is_refused_before_loading(eval_dirs, tmp_path, no_model_loading, overrides, error, message):
    if overrides.get("head") == ["HEAD_OTHER"]:
        overrides["head"] = [eval_dirs["head_other"]]
    with pytest.raises(error, match=message):
        make_args(eval_dirs, tmp_path, **overrides).evaluate()


def test_models_with_different_vocabularies_are_refused(eval_dirs, tmp_path, no_model_loading):
    from conftest import tiny_llama

    other = tmp_path / "other_draft"
    tiny_llama(vocab_size=80).save_pretrained(other)
    with pytest.raises(ValueError, match=r"vocabulary \(64\) and draft vocabulary \(80\) differ"):
        make_args(eval_dirs, tmp_path, draft=str(other)).evaluate()


def test_a_draft_with_recurrent_layers_is_refused(eval_dirs, tmp_path):
    from conftest import tiny_recurrent

    recurrent = tmp_path / "jamba_draft"
    tiny_recurrent("jamba").save_pretrained(recurrent)
    with pytest.raises(ValueError, match=r"the draft \(JambaForCausalLM\) has recurrent layers"):
        make_args(eval_dirs, tmp_path, draft=str(recurrent), schedule=["constant"]).evaluate()


def test_an_output_that_cannot_be_written_is_refused(eval_dirs, tmp_path, no_model_loading):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="cannot write results to --output"):
        make_args(eval_dirs, tmp_path, output=str(blocker / "out")).evaluate()


def test_the_script_reports_bad_input_in_one_line():
    result = subprocess.run([sys.executable, "specdecpp/evaluate.py", "--bound", "20", "2"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == (
        "specdecpp evaluate: error: --bound must be (min, max) integers with 0 <= min <= max and max >= 1, got (20, 2)")


# -- Hugging Face's baselines, counted from outside --------------------------------------------
def test_rounds_are_read_off_the_target_forward_passes():
    # prompt of 7; round 1 feeds prompt + 4 drafts; later rounds feed last token + k drafts
    calls = [(11, 0), (5, 8), (5, 9), (3, 13), (1, 15)]
    accepted, drafted = ev.rounds_from_target_calls(calls, prompt_length=7, generated=10)
    assert drafted == [4, 4, 4, 2, 0]
    assert accepted == [1, 0, 3, 1, 0]  # tokens generated before each round: 0, 2, 3, 7, 9, then 10


@pytest.fixture(scope="module")
def pair(eval_dirs):
    names = ev.HeadPairArguments(target=eval_dirs["target"], draft=eval_dirs["draft"], head=[eval_dirs["head"]])
    return ev.load_pair(names, tokenizer=None, need_head=True)


def test_hf_constant_counts_equal_our_engine_round_by_round(pair):
    decoding = ev.DecodingSettings(max_new_tokens=20)
    prompt = ev.Prompt(0, "", [1, 5, 9, 14, 30], 20)
    def spec(engine):
        return ev.MethodSpec(f"{engine}:constant@K=3", engine, "constant", num_assistant_tokens=3)

    ours = ev.build_method(spec("specdecpp"), pair, decoding).generate(prompt, 0)
    theirs = ev.build_method(spec("hf"), pair, decoding).generate(prompt, 0)
    target = ev.build_method(ev.MethodSpec("target", None, "none"), pair, decoding).generate(prompt, 0)
    assert len(theirs.tokens) == 20 and theirs.tokens == target.tokens == ours.tokens
    assert theirs.accepted_lengths == ours.accepted_lengths
    assert (theirs.target_calls, theirs.discarded_tokens) == (ours.target_calls, ours.discarded_tokens)
    assert theirs.target_calls == len(theirs.accepted_lengths)
    # Hugging Face's draft prefills the prompt inside its first round: one forward per drafted token
    assert theirs.draft_calls == ours.draft_calls
    assert target.target_calls == 20 and target.draft_calls == 0


def test_hf_methods_leave_the_draft_generation_config_alone(pair):
    before = pair.draft.generation_config.to_dict()
    spec = ev.MethodSpec("hf:heuristic@K=2", "hf", "heuristic", num_assistant_tokens=2)
    ev.build_method(spec, pair, ev.DecodingSettings()).generate(ev.Prompt(0, "", [1, 5, 9], 12), 0)
    assert pair.draft.generation_config.to_dict() == before


# -- a whole run ----------------------------------------------------------------------------------
def test_a_run_writes_records_summary_and_figures(eval_dirs, tmp_path):
    args = make_args(eval_dirs, tmp_path, schedule=["constant", "ada"], stop_threshold=[0.2, 0.6],
                     num_assistant_tokens=[3], baselines=["target", "draft", "hf:dynamic"], n_end=3)
    document = args.evaluate()
    out = Path(args.run.output)
    records = json.loads((out / "results_0to3.json").read_text())
    methods = ["target", "draft", "hf:dynamic", "specdecpp:constant@K=3", "specdecpp:ada@0.2", "specdecpp:ada@0.6"]
    assert [r["method"] for r in records] == methods * 3
    reference_fields = {"id", "spec_time", "target_time", "draft_time", "num_mismatched_tokens", "num_LM_call",
                        "generated_length", "generated_length_target", "generated_length_draft"}
    assert reference_fields <= set(records[0])
    for r in records:
        assert r["generated_length"] == 10 and r["spec_time"] > 0
        if r["engine"] is not None:  # no EOS in these models: every round emits accepted + 1
            assert r["generated_length"] == sum(r["accepted_lengths"]) + len(r["accepted_lengths"])
            assert r["matches_target"] is True and r["first_difference_margin"] is None
            assert r["output"] == next(t for t in records if t["id"] == r["id"] and t["method"] == "target")["output"]
    summary = json.loads((out / "summary.json").read_text())
    assert [row["method"] for row in summary["summary"]] == methods
    target_row = summary["summary"][0]
    assert target_row["target_calls_per_token"] == 1.0 and target_row["cost_per_token"] == 1.0
    assert summary["greedy_check"].startswith("greedy check passed") and "(4)" in summary["greedy_check"]
    per_prompt = {r["id"]: (r["draft_step_ms"], r["target_verify_ms"]) for r in records}
    assert all((r["draft_step_ms"], r["target_verify_ms"]) == per_prompt[r["id"]] for r in records)
    draft_ms, target_ms = zip(*per_prompt.values())
    assert summary["cost"]["prompts"] == 3 and summary["cost"]["steps_per_prompt"] == 2
    assert summary["cost"]["cost_ratio"] == pytest.approx(statistics.median(draft_ms) / statistics.median(target_ms))
    assert document["table"] == summary["table"]
    assert summary["title"] == f"{eval_dirs['prompts']} prompts 0-2, greedy, 10 new tokens"
    for figure in ("pareto.png", "speedup_vs_threshold.png"):
        assert (out / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # compiles every method's graphs
@pytest.mark.skipif(not compiled.STATIC_CACHE_CROPS, reason="transformers < 5.24: compile=True is refused")
def test_compile_runs_our_methods_compiled_and_reports_the_compile_time(eval_dirs, tmp_path):
    """--compile: our methods (the models alone included) compile in the warm-up, never in a timed
    run, outputs still equal the target's, Hugging Face's rows run as before."""
    args = make_args(eval_dirs, tmp_path, schedule=["constant", "ada"], stop_threshold=[0.5], num_assistant_tokens=[3],
                     baselines=["target", "draft", "hf:constant"], n_end=3, compile=True)
    document = args.evaluate()
    records = json.loads(Path(document["records_file"]).read_text())
    assert document["cost"]["compile_seconds"] > 0 and document["settings"]["compile"] is True
    assert all(r["compile_time"] == 0 for r in records)
    assert all(r["matches_target"] is True for r in records if r["engine"] == "specdecpp")
    assert document["greedy_check"].startswith("greedy check passed")


def test_the_embedded_pairs_heldout_prompts_are_a_prompt_set():
    ev.check_prompt_source("stdlib-heldout")


def test_sampling_runs_are_seeded_per_prompt_and_not_greedy_checked(eval_dirs, tmp_path):
    args = make_args(eval_dirs, tmp_path, schedule=["constant"], num_assistant_tokens=[2],
                     baselines=["target", "hf:constant"], do_sample=True, temperature=0.8, top_k=20, n_end=2,
                     plots=False)
    first = args.evaluate()
    records = json.loads(Path(first["records_file"]).read_text())
    assert all(r["matches_target"] is None for r in records) and first["greedy_check"] is None
    args.run.overwrite = True
    again = json.loads(Path(args.evaluate()["records_file"]).read_text())
    assert [r["tokens"] for r in again] == [r["tokens"] for r in records]  # same seeds, same samples


def test_a_repetition_penalty_reaches_every_method_and_the_greedy_check(eval_dirs, tmp_path):
    from specdecpp.models import load_model

    args = make_args(eval_dirs, tmp_path, schedule=["constant"], num_assistant_tokens=[3],
                     baselines=["target", "hf:constant"], repetition_penalty=1.5, n_end=3, plots=False)
    assert args.decoding.settings().processing_fields() == {"repetition_penalty": 1.5}
    document = args.evaluate()
    records = json.loads(Path(document["records_file"]).read_text())
    assert document["settings"]["repetition_penalty"] == 1.5
    assert document["greedy_check"].startswith("greedy check passed")
    target = load_model(eval_dirs["target"])
    changed = 0
    assert len(records) == 9  # three methods on three prompts
    for record in records:
        kwargs = dict(max_new_tokens=10, do_sample=False, pad_token_id=0, eos_token_id=None)
        prompt = torch.tensor([record["prefix"]])
        expected = target.generate(prompt, repetition_penalty=1.5, **kwargs)[0, prompt.shape[1]:].tolist()
        assert record["tokens"] == expected, record["method"]  # ours, the target alone and Hugging Face's
        changed += expected != target.generate(prompt, **kwargs)[0, prompt.shape[1]:].tolist()
    assert changed > 0, "the penalty should change some prompts' outputs, Hugging Face's among them"


def test_resume_keeps_finished_prompts_and_runs_only_the_rest(eval_dirs, tmp_path):
    args = make_args(eval_dirs, tmp_path, schedule=["constant"], num_assistant_tokens=[2],
                     baselines=["target"], n_end=3, plots=False)
    full = json.loads(Path(args.evaluate()["records_file"]).read_text())
    interrupted = [dict(r, spec_time=-1.0) for r in full if r["id"] == 0]  # marked: must survive as saved
    path = Path(args.run.output) / "results_0to3.json"
    path.write_text(json.dumps(interrupted))
    args.run.resume = True
    resumed = json.loads(Path(args.evaluate()["records_file"]).read_text())
    assert [(r["id"], r["method"]) for r in resumed] == [(r["id"], r["method"]) for r in full]
    assert [r["spec_time"] for r in resumed[:2]] == [-1.0, -1.0] and all(r["spec_time"] > 0 for r in resumed[2:])
    assert [r["tokens"] for r in resumed] == [r["tokens"] for r in full]


def test_resume_refuses_records_of_other_methods_before_loading_a_model(eval_dirs, tmp_path, monkeypatch):
    args = make_args(eval_dirs, tmp_path, schedule=["constant"], num_assistant_tokens=[2],
                     baselines=["target"], n_end=2, plots=False)
    args.evaluate()
    args.grid.num_assistant_tokens, args.run.resume = [3], True
    monkeypatch.setattr(arguments, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(ValueError, match="other methods than this run"):
        args.evaluate()


def test_a_rerun_without_resume_or_overwrite_keeps_the_finished_records(eval_dirs, tmp_path, no_model_loading):
    args = make_args(eval_dirs, tmp_path, n_end=2)
    path = Path(args.run.output) / "results_0to2.json"
    path.parent.mkdir()
    path.write_text('[{"id": 0, "method": "target", "prefix": [1]}]')
    with pytest.raises(ValueError, match=f"{path} holds the records of an earlier run: pass --resume .* --overwrite"):
        args.evaluate()
    assert path.read_text() == '[{"id": 0, "method": "target", "prefix": [1]}]'
    args.run.resume = args.run.overwrite = True
    with pytest.raises(ValueError, match="pass one of them"):
        args.evaluate()
    args.run.resume = False
    with pytest.raises(AssertionError, match="a model was loaded"):  # --overwrite goes on to run
        args.evaluate()


def test_a_damaged_results_file_is_named_with_the_way_out(eval_dirs, tmp_path, no_model_loading):
    args = make_args(eval_dirs, tmp_path, n_end=2, resume=True)
    path = Path(args.run.output) / "results_0to2.json"
    path.parent.mkdir()
    for damaged, why in (('[{"id": 0, "method": "tar', "Unterminated string"), ('{"id": 0}', "not a list of records")):
        path.write_text(damaged)
        with pytest.raises(SystemExit) as exit_:
            ev.main(["--model_name", args.pair.target, "--assistant_name", args.pair.draft, "--assist_acc_head_dir",
                     args.pair.head[0], "--data_path", args.source.prompts, "--n_end", "2", "--save_path",
                     args.run.output, "--resume"])
        assert exit_.value.code.startswith(f"specdecpp evaluate: error: results file {path} is damaged ({why}")
        assert exit_.value.code.endswith("rerun with --overwrite to start again, or restore it")


def test_a_run_that_fails_before_saving_leaves_no_save_path_behind(eval_dirs, tmp_path):
    import shutil

    target = tmp_path / "target"
    shutil.copytree(eval_dirs["target"], target)
    weights = target / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    args = make_args(eval_dirs, tmp_path, target=str(target), output=str(tmp_path / "new" / "out"), n_end=2)
    with pytest.raises(ValueError, match=f"damaged weights file {weights} "):
        args.evaluate()
    assert not (tmp_path / "new").exists()


class FixedProbe:
    k = 4

    def __init__(self):
        self.steps = []

    def sample(self, steps):
        self.steps.append(steps)
        return [0.002] * steps, [0.010] * steps


def test_run_cost_is_the_median_over_timed_prompts():
    timed = [{"id": 0, "draft_step_ms": 1.0, "target_verify_ms": 10.0},
             {"id": 0, "draft_step_ms": 1.0, "target_verify_ms": 10.0},
             {"id": 1, "draft_step_ms": 3.0, "target_verify_ms": 12.0},
             {"id": 2, "draft_step_ms": 2.0, "target_verify_ms": 20.0}]
    probe = FixedProbe()
    cost = ev.run_cost(timed, probe, steps_per_prompt=5)
    assert cost == {"cost_ratio": 2.0 / 12.0, "draft_step_ms": 2.0, "target_verify_ms": 12.0, "k": 4,
                    "steps_per_prompt": 5, "prompts": 3}
    assert probe.steps == []


# -- the greedy check tells a near-tie from a failure --------------------------------------------
class FixedLogits(torch.nn.Module):
    """A hand-made 'target': the logits after a token are that token's row of `table`."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = torch.nn.Embedding.from_pretrained(table)

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.table

    def forward(self, input_ids: torch.Tensor):
        return types.SimpleNamespace(logits=self.table(input_ids))


def test_first_difference_margin_is_the_targets_top_two_gap_after_the_common_prefix():
    table = torch.zeros(4, 4)
    table[0] = torch.tensor([0.0, 3.0, 1.0, 0.0])  # after the prompt: a clear choice
    table[1] = torch.tensor([0.0, 0.0, 5.0, 4.996])  # after the common prefix: a near-tie
    target = FixedLogits(table)
    margin = runner.first_difference_margin(target, [0], tokens=[1, 3, 3], reference=[1, 2, 2])
    assert margin == pytest.approx(0.004, abs=1e-5)
    assert runner.first_difference_margin(target, [0], tokens=[2], reference=[1, 2]) == pytest.approx(2.0)


def test_outside_a_checkout_a_missing_embedded_pair_says_where_and_what_to_do(eval_dirs, tmp_path, monkeypatch,
                                                                            no_model_loading):
    zoo = tmp_path / "site-packages" / "checkpoints" / "zoo"  # what a non-editable install would look for
    monkeypatch.setattr(arguments, "ZOO_DIR", zoo)
    args = make_args(eval_dirs, tmp_path, target=str(zoo / "target"), draft=str(zoo / "draft"))
    with pytest.raises(FileNotFoundError) as error:
        args.evaluate()
    message = str(error.value)
    assert f"no model folder at {zoo / 'draft'}" in message and f"expected in {zoo}" in message
    assert "--target TARGET --draft DRAFT --head HEAD" in message
