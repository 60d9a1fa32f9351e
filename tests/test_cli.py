"""One vocabulary of flags: every command takes the common names (`--target`, `--draft`, `--head`,
`--prompts`, `--records`, `--seed`, `--output`, `--torch_dtype`, `--device`), lists them first in
its --help, and still takes the reference's and earlier spellings for the same field; every
command line in the docs and the zoo's cards parses. Parsing only: no model is loaded."""
from __future__ import annotations

import importlib
import importlib.util
import json
import re
from pathlib import Path

import pytest
from transformers import HfArgumentParser

from specdecpp import cli

REPO = Path(__file__).resolve().parent.parent

# Per command: its required flags (the values are placeholders), and for each field the spellings
# that must all set it: the common name first, then the reference's and earlier ones.
PAIR = {"target": ["--target", "--model_name"], "draft": ["--draft", "--assistant_name", "--model_name_or_path"],
        "torch_dtype": ["--torch_dtype"], "device": ["--device"]}
HEAD = {"head": ["--head", "--assist_acc_head_dir"]}
SEED = {"seed": ["--seed", "--random_seed"]}
COMMANDS = {
    "specdecpp.data.build_data": (["--prompts", "p", "--output", "o.jsonl"], PAIR | SEED | {
        "prompts": ["--prompts"], "output": ["--output"], "prompts_split": ["--prompts_split"]}),
    "specdecpp.train": (["--use_cpu", "True", "--report_to", "none"], PAIR | SEED | {
        "records": ["--records", "--data_path"], "eval_records": ["--eval_records", "--eval_data_path"],
        "output_dir": ["--output", "--output_dir"]}),
    "specdecpp.calibration.report": (["--records", "r.jsonl"], PAIR | HEAD | SEED | {
        "records": ["--records", "--data_path"], "output": ["--output"]}),
    "specdecpp.evaluate": ([], PAIR | HEAD | SEED | {
        "prompts": ["--prompts", "--data_path"], "output": ["--output", "--save_path"],
        "prompts_split": ["--prompts_split", "--data_split"],
        "schedule": ["--schedule", "--num_assistant_tokens_schedule"]}),
    "specdecpp.evaluation.demo": ([], PAIR | HEAD | SEED | {"prompts": ["--prompts", "--data_path"],
                                                 "output": ["--output", "--save_path"]}),
    "specdecpp.training.zoo": ([], SEED | {"output": ["--output", "--output_dir"], "device": ["--device"]}),
}
VALUES = {"seed": "7", "schedule": "ada", "torch_dtype": "bfloat16"}  # others: any path-like text


def parse(module: str, argv: list[str]) -> list:
    return HfArgumentParser(importlib.import_module(module).FLAGS).parse_args_into_dataclasses(args=argv)


def field_value(parsed: list, name: str):
    """The field `name` of the first parsed dataclass that has it (the pair comes first)."""
    return next(getattr(values, name) for values in parsed if name in vars(values))


@pytest.mark.parametrize("module, name, flag", [(module, name, flag) for module, (_, spellings) in COMMANDS.items()
                                                for name, flags in spellings.items() for flag in flags])
def test_every_spelling_sets_the_same_field(module, name, flag):
    required, _ = COMMANDS[module]
    value = VALUES.get(name, "v.jsonl")
    parsed = field_value(parse(module, [*required, flag, value]), name)
    assert (parsed[0] if isinstance(parsed, list) else parsed) in (value, int(value) if value.isdigit() else value)


def test_the_references_evaluate_command_still_runs_ada_at_its_threshold():
    from specdecpp import evaluate as ev

    pair, grid, *_ = ev.parse_args(["--model_name", "T", "--assistant_name", "D", "--assist_acc_head_dir", "H",
                                    "--schedule", "ada", "--stop_threshold", "0.3"])
    assert (pair.target, pair.draft, pair.head) == ("T", "D", ["H"])
    assert [spec.name for spec in ev.method_specs(grid, pair.head) if spec.engine == "specdecpp"] == [
        "specdecpp:ada@0.3"]


# -- --help leads with the common names --------------------------------------------------------------
TAKES_A_PAIR = ("build-data", "train", "calibration", "evaluate", "demo")
TAKES_A_HEAD = ("calibration", "evaluate", "demo")
COMMON = {"build-data": ["--prompts", "--output", "--seed"], "train": ["--records", "--eval_records", "--seed"],
          "calibration": ["--records", "--output", "--seed"], "evaluate": ["--prompts", "--output", "--seed"],
          "demo": ["--prompts", "--output", "--seed"], "zoo": ["--output", "--seed", "--device"]}


def help_text(command: str, capsys) -> str:
    argv = [command, "build", "--help"] if command == "zoo" else [command, "--help"]
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code in (0, None)
    return capsys.readouterr().out


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_every_help_lists_the_common_names_first(command, capsys):
    text = help_text(command, capsys)
    expected = COMMON.get(command, [])
    if command in TAKES_A_PAIR:
        expected = ["--target", "--draft", "--torch_dtype", "--device", *expected]
    if command in TAKES_A_HEAD:
        expected.append("--head")
    options = [line.split()[0].rstrip(",") for line in text.splitlines() if line.startswith("  -")]
    for flag in expected:
        assert flag in options, f"{command} --help does not lead a line with {flag}"
    # no other spelling of a common name leads a line (train's --output_dir is TrainingArguments' own field)
    others = {alias for aliases in cli.ALIASES.values() for alias in aliases} - {"--output_dir"}
    assert not others & set(options), f"{command} --help leads with {others & set(options)}"
    if command == "push":
        assert "\n  head " in text  # its one positional: the head folder


# -- every documented command line parses -----------------------------------------------------------
COMMAND_MODULES = {"build_data": "specdecpp.data.build_data", "build-data": "specdecpp.data.build_data",
                   "gen_data": "specdecpp.data.build_data", "train": "specdecpp.train",
                   "calibration": "specdecpp.calibration.report", "evaluate": "specdecpp.evaluate",
                   "demo": "specdecpp.evaluation.demo", "zoo": "specdecpp.training.zoo", "head": "specdecpp.training.recipe"}
INVOCATION = re.compile(r"(?:specdecpp/(\w+)\.py|-m specdecpp\.([\w.]+)|\bspecdecpp ([a-z-]+)|\b(\w+)\.sh)(.*)")


def card_commands(card: object) -> list[str]:
    """Every "command" string in a card, at any depth."""
    if isinstance(card, dict):
        return [c for key, value in card.items() for c in ([value] if key == "command" else card_commands(value))]
    return [c for value in card for c in card_commands(value)] if isinstance(card, list) else []


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """`(where, command module, flags)` for every command line in the README, the scripts and the
    zoo's cards (the flags that follow the command, up to the end of the line or the code span)."""
    texts = {name: (REPO / name).read_text(encoding="utf-8") for name in
             ("README.md", "evaluate.sh", "train.sh", "data/gen_data.sh")}
    for card in sorted(REPO.glob("checkpoints/zoo/*/card.json")):
        texts[str(card.relative_to(REPO))] = "\n".join(card_commands(json.loads(card.read_text(encoding="utf-8"))))
    found = []
    for where, text in texts.items():
        for line in re.sub(r"\\\n\s*", " ", text).splitlines():
            for match in INVOCATION.finditer(line):
                name = next(group for group in match.groups()[:4] if group)
                rest = re.split(r"`|#|;|&&|\|| \(", match.group(5))[0]
                module = f"specdecpp.{name}" if match.group(2) else COMMAND_MODULES.get(name)  # -m names the module
                if module in COMMAND_MODULES.values():
                    found.append((where, module, re.findall(r"(?<![\w-])--[A-Za-z][\w-]*", rest)))
    return found


def test_every_documented_command_line_uses_flags_its_command_takes():
    commands = documented_commands()
    assert {module for _, module, flags in commands if flags} >= {
        "specdecpp.data.build_data", "specdecpp.train", "specdecpp.calibration.report", "specdecpp.evaluate"}
    for where, module, flags in commands:
        known = HfArgumentParser(importlib.import_module(module).FLAGS)._option_string_actions
        assert not [flag for flag in flags if flag not in known], (where, module, flags)


def test_every_documented_module_exists():
    """A documented `python -m specdecpp.<module>` names a module of the package (the folders moved
    modules, so `-m specdecpp.build_data` would no longer run)."""
    texts = [(REPO / name).read_text(encoding="utf-8") for name in
             ("README.md", "evaluate.sh", "train.sh", "data/gen_data.sh", "docs/design.md")]
    texts += [json.dumps(json.loads(card.read_text(encoding="utf-8")))
              for card in sorted(REPO.glob("checkpoints/zoo/*/card.json"))]
    named = {module for text in texts for module in re.findall(r"-m (specdecpp(?:\.\w+)+)", text)}
    assert "specdecpp.data.build_data" in named
    assert not [module for module in named if importlib.util.find_spec(module) is None]
