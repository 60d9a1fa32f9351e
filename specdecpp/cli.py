"""The `specdecpp` console script: `specdecpp <command> [args]`, one command per module.

Each command is the module's own `main(argv)`, so `specdecpp train ...`,
`python -m specdecpp.train ...` and `python specdecpp/train.py ...` are the same program.
Every command reports input it rejects the same way (`input_errors`): one line, non-zero exit.
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager

COMMANDS = {
    "build-data": ("specdecpp.build_data", "build training data (target continuations, draft proposals, p_acc)"),
    "train": ("specdecpp.train", "train the acceptance prediction head"),
    "calibration": ("specdecpp.calibration", "calibration report of a trained head"),
    "evaluate": ("specdecpp.evaluate", "evaluate schedules against baselines"),
    "zoo": ("specdecpp.zoo", "build the embedded small target/draft pair"),
    "demo": ("specdecpp.demo", "the one-command demo on the embedded pair"),
    "push": ("specdecpp.publish", "publish a head folder on the Hub (head files and custom_generate/ only)"),
}


@contextmanager
def input_errors(command: str) -> Iterator[None]:
    """Turn the errors a command raises on input it rejects (ValueError, FileNotFoundError, whose
    messages name the input and the fix) into one line, `specdecpp COMMAND: error: MESSAGE`, and a
    non-zero exit, without a traceback; any other error is unexpected and keeps its traceback."""
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
