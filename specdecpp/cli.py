"""The `specdecpp` console script: each command a module's `main(argv)`, sharing flags and one-line input errors."""
from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import Field, field
from typing import Any

COMMANDS = {
    "head": ("specdecpp.training.recipe", "from a pair to a calibrated head folder: every stage below, resumable (a recipe)"),
    "build-data": ("specdecpp.data.build_data", "build training data (target continuations, draft proposals, p_acc)"),
    "train": ("specdecpp.train", "train the acceptance prediction head"),
    "calibration": ("specdecpp.calibration.report", "calibration report of a trained head"),
    "evaluate": ("specdecpp.evaluate", "evaluate schedules against baselines"),
    "zoo": ("specdecpp.training.zoo", "build the embedded small target/draft pair"),
    "demo": ("specdecpp.evaluation.demo", "the one-command demo on the embedded pair"),
    "push": ("specdecpp.head.publish", "publish a head folder on the Hub (head files and custom_generate/ only)"),
}

# The common flags and the reference's spellings; a command adds `--data_path` / `--output_dir` where it used them.
ALIASES = {"target": ["--model_name"], "draft": ["--assistant_name", "--model_name_or_path"],
           "head": ["--assist_acc_head_dir"], "prompts": [], "prompts_split": ["--data_split"], "records": [],
           "eval_records": ["--eval_data_path"], "seed": ["--random_seed"], "output": ["--save_path"], "device": []}


def common_field(name: str, *, aliases: tuple[str, ...] = (), **kwargs: Any) -> Field:
    """A dataclass field for the common flag `--name`, also accepted under `ALIASES[name]` and `aliases`."""
    options = {key: kwargs.pop(key) for key in ("default", "default_factory") if key in kwargs}
    return field(**options, metadata={"aliases": [*ALIASES[name], *aliases], **kwargs})


def option(default: Any, help: str, **metadata: Any) -> Field:
    """A dataclass field for the flag of this name: its `default` (a list copied for each instance) and `help`."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help, **metadata})
    return field(default=default, metadata={"help": help, **metadata})


@contextmanager
def input_errors(command: str) -> Iterator[None]:
    """Turn ValueError and FileNotFoundError into `specdecpp COMMAND: error: MESSAGE` and a non-zero exit."""
    try:
        yield
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"specdecpp {command}: error: {error}")


def main(argv: list[str] | None = None) -> None:
    """Dispatch `specdecpp <command> [args]` to the command module's `main`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: specdecpp <command> [args]\n\ncommands:")
        for name, (_, help_text) in COMMANDS.items():
            print(f"  {name:12s} {help_text}")
        sys.exit(0 if argv else 2)
    name = argv[0].replace("_", "-")
    if name not in COMMANDS:
        sys.exit(f"specdecpp: unknown command {argv[0]!r}; choose from {', '.join(COMMANDS)}")
    importlib.import_module(COMMANDS[name][0]).main(argv[1:])


if __name__ == "__main__":
    main()
