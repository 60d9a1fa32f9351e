"""`specdecpp head`: the recipe file, the command line, and the whole pipeline end to end, resumed."""
from __future__ import annotations

import importlib
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from transformers import HfArgumentParser

from specdecpp.training import recipe as recipe_module
from specdecpp.training.recipe import (RECIPE_FILE, Recipe, Stage, StageError, launch, main, parse_args, recipe_changes,
                                       run_recipe, stages)

ROOT = Path(__file__).resolve().parent.parent
ZOO = ROOT / "checkpoints" / "zoo"
EXAMPLE = ROOT / "recipes" / "zoo-small.yaml"


def test_example_recipe_reads_and_round_trips(tmp_path):
    recipe = Recipe.from_yaml(EXAMPLE)
    assert (recipe.prompts, recipe.bound, recipe.learning_rate, recipe.head_width) == ("stdlib-train", [1, 20], 1e-2, 64)
    again = Recipe.from_yaml(recipe.to_yaml(tmp_path / "r.yaml"))
    assert asdict(again) == asdict(recipe)


def test_yaml_values_are_coerced_to_the_field_types(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("target: t\ndraft: d\nprompts: p\nlearning_rate: 1e-3\neval_stop_thresholds: [auto, 0.3]\n"
                    "epochs: 2\n")
    recipe = Recipe.from_yaml(path)
    assert (recipe.learning_rate, recipe.eval_stop_thresholds, recipe.epochs) == (1e-3, ["auto", "0.3"], 2.0)


@pytest.mark.parametrize("text, message", [
    ("target: t\ndraft: d\nprompts: p\nn_trian: 5\n", "unknown recipe setting(s) n_trian"),
    ("draft: d\nprompts: p\n", "needs target"),
    ("target: t\ndraft: d\nprompts: p\nn_train: many\n", "n_train must be int, got 'many'"),
    ("target: t\ndraft: d\nprompts: p\nbound: [5, 2]\n", "bound must be MIN MAX"),
    ("- target\n", "must be a mapping"),
])
def test_bad_recipe_files_fail_clearly(tmp_path, text, message):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        Recipe.from_yaml(path)


def test_command_line_overrides_the_recipe_file_and_rejects_bad_input(tmp_path):
    recipe, command = parse_args(["--recipe", str(EXAMPLE), "--n_train", "7", "--bound", "2", "9",
                                  "--output", str(tmp_path / "h")])
    assert (recipe.n_train, recipe.bound, recipe.n_dev, command.output) == (7, [2, 9], 50, str(tmp_path / "h"))
    # a folder that holds a recipe resumes from it with --output alone
    recipe.to_yaml(tmp_path / "h" / RECIPE_FILE)
    assert asdict(parse_args(["--output", str(tmp_path / "h")])[0]) == asdict(recipe)
    with pytest.raises(SystemExit, match="specdecpp head: error: the recipe needs target, draft, prompts"):
        main(["--output", str(tmp_path / "empty")])
    with pytest.raises(SystemExit, match="--no_such_flag"):
        main(["--recipe", str(EXAMPLE), "--no_such_flag", "1", "--output", str(tmp_path / "x")])


def test_a_folder_takes_changes_to_its_later_stages_only(tmp_path):
    recipe = Recipe.from_yaml(EXAMPLE)
    assert recipe_changes(recipe, tmp_path) == set()
    recipe.to_yaml(tmp_path / RECIPE_FILE)
    assert recipe_changes(replace(recipe, nproc_per_node=8), tmp_path) == set()  # how it runs may change
    assert recipe_changes(replace(recipe, eval_n=5, bound=[2, 9]), tmp_path) == {"eval_n", "bound"}
    with pytest.raises(ValueError, match=r"records made with other settings \(n_dev: 50 -> 10\)"):
        recipe_changes(replace(recipe, n_dev=10), tmp_path)


def test_a_stage_that_runs_drops_the_results_of_those_that_read_it(tmp_path, monkeypatch):
    made = tmp_path / "a.txt", tmp_path / "b.txt"
    for path in made:
        path.write_text("old")
    pipeline = [Stage("a", done=lambda: False, results=(made[0],), action=lambda: made[0].write_text("new")),
                Stage("b", done=made[1].is_file, after=("a",), results=(made[1],),
                      action=lambda: made[1].write_text("new"))]
    monkeypatch.setattr(recipe_module, "stages", lambda recipe, out: pipeline)
    assert run_recipe(Recipe.from_yaml(EXAMPLE), tmp_path) == {"a": "ran", "b": "ran"}
    assert [path.read_text() for path in made] == ["new", "new"]


def test_a_changed_setting_drops_its_stages_results(tmp_path, monkeypatch):
    recipe, summary = Recipe.from_yaml(EXAMPLE), tmp_path / "summary.json"
    recipe.to_yaml(tmp_path / RECIPE_FILE)
    summary.write_text("{}")
    evaluation = Stage("evaluation", done=summary.is_file, results=(summary,), action=lambda: summary.write_text("{}"))
    monkeypatch.setattr(recipe_module, "stages", lambda recipe, out: [evaluation])
    assert run_recipe(recipe, tmp_path) == {"evaluation": "skipped"}
    assert run_recipe(replace(recipe, eval_n=3), tmp_path) == {"evaluation": "ran"}
    assert Recipe.from_yaml(tmp_path / RECIPE_FILE).eval_n == 3


def test_distributed_stages_run_under_torchrun():
    assert launch("specdecpp.train", ["--x"], 2)[1:] == ["-m", "torch.distributed.run", "--standalone",
                                                          "--nproc_per_node", "2", "-m", "specdecpp.train", "--x"]
    assert launch("specdecpp.train", ["--x"], 1)[1:] == ["-m", "specdecpp.train", "--x"]


def test_every_stage_command_takes_its_flags(tmp_path):
    """Each stage's command line, with the settings the end-to-end run leaves out (sampling, a Hub
    split, remote code), parses with its command's own flags (parsing only, no model loads)."""
    recipe = replace(Recipe.from_yaml(EXAMPLE), prompts="org/prompts", prompts_split="train",
                     eval_prompts="org/prompts", do_sample=True, temperature=0.7, trust_remote_code=True, step_times_from="h")
    commands = [stage.command() for stage in stages(recipe, tmp_path) if stage.command]
    assert len(commands) == 5
    for command in commands:
        at = len(command) - 1 - command[::-1].index("-m")
        module, args = command[at + 1], command[at + 2:]
        HfArgumentParser(importlib.import_module(module).FLAGS).parse_args_into_dataclasses(args=args)
    assert commands[-1][commands[-1].index("--n_begin"):][:4] == ["--n_begin", "350", "--n_end", "370"]
    assert commands[2][commands[2].index("--head_width"):][:2] == ["--head_width", "64"]  # the training's
    assert commands[2][commands[2].index("--head_features"):][:2] == ["--head_features", "none"]
    for command in commands[-2:]:  # calibration times the steps with the threads the evaluation decodes with
        assert command[command.index("--threads"):][:2] == ["--threads", "1"]


def test_a_failed_stage_stops_with_its_command(tmp_path, monkeypatch):
    failing = Stage("broken", done=lambda: False, command=lambda: [sys.executable, "-c", "raise SystemExit(3)"])
    monkeypatch.setattr(recipe_module, "stages", lambda recipe, out: [failing])
    with pytest.raises(StageError, match=r"stage broken failed \(exit status 3\): .* -c 'raise SystemExit\(3\)'"):
        run_recipe(Recipe.from_yaml(EXAMPLE), tmp_path)


@pytest.mark.slow  # the recipe end to end
def test_pipeline_end_to_end_on_the_zoo_pair_then_resumed(tmp_path, capsys, monkeypatch):
    """The example recipe in test size (6 train and 3 dev prompts of 16 tokens, one epoch, one rank,
    the zoo head's step times, two evaluation prompts): a calibrated head folder with its recipe, card
    and evaluation; a rerun skips every stage; without the evaluation's summary only the evaluation
    runs (resumed from its records, so the card it feeds stays as it is)."""
    recipe = replace(Recipe.from_yaml(EXAMPLE), target=str(ZOO / "target"), draft=str(ZOO / "draft"), n_train=6,
                     n_dev=3, max_new_tokens=16, epochs=1.0, nproc_per_node=1, eval_n=2, eval_max_new_tokens=16,
                     eval_num_assistant_tokens=[2], eval_confidence_thresholds=[0.4],
                     step_times_from=str(ZOO / "head"))  # timing the pair would take most of the test's time
    out = tmp_path / "head"
    assert set(run_recipe(recipe, out).values()) == {"ran"}
    config = json.loads((out / "config.json").read_text())
    assert 0 <= config["stop_threshold"] <= 1 and config["threshold_selection"]["bound"] == [1, 20]
    assert asdict(Recipe.from_yaml(out / RECIPE_FILE)) == asdict(recipe)
    summary = json.loads((out / "evaluation" / "summary.json").read_text())
    methods = [row["method"] for row in summary["summary"]]
    assert all(any(m.startswith(kind) for m in methods)
               for kind in ("target", "specdecpp:constant@K=2", "specdecpp:dynamic", "specdecpp:ada@auto"))
    assert json.loads((out / "card.json").read_text())["recipe"] == asdict(recipe)
    card = (out / "README.md").read_text()
    assert "## How this head was made" in card and "n_train: 6" in card and "| specdecpp:ada@auto " in card

    capsys.readouterr()
    monkeypatch.setattr(recipe_module.subprocess, "run", None)  # a stage that ran would fail here
    start = time.process_time()
    main(["--output", str(out)])  # the folder's own recipe, every stage done
    assert capsys.readouterr().out.count("done, skipped") == 6
    assert time.process_time() - start < 5
    monkeypatch.undo()

    (out / "evaluation" / "summary.json").unlink()
    outcome = run_recipe(recipe, out)
    assert [name for name, how in outcome.items() if how == "ran"] == ["evaluation"]  # the card holds its table
    assert (out / "evaluation" / "summary.json").is_file()
