"""The `specdecpp` console script: `specdecpp <command> [args]`, one command per module.

Each command is the module's own `main(argv)`, so `specdecpp train ...`,
`python -m specdecpp.train ...` and `python specdecpp/train.py ...` are the same program.
"""
from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "build-data": ("specdecpp.build_data", "build training data (target continuations, draft proposals, p_acc)"),
    "train": ("specdecpp.train", "train the acceptance prediction head"),
    "calibration": ("specdecpp.calibration", "calibration report of a trained head"),
    "evaluate": ("specdecpp.evaluate", "evaluate schedules against baselines"),
    "zoo": ("specdecpp.zoo", "build the embedded small target/draft pair"),
    "demo": ("specdecpp.demo", "the one-command demo on the embedded pair"),
    "push": ("specdecpp.publish", "publish a head folder on the Hub (head files and custom_generate/ only)"),
}


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
