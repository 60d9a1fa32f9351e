"""From a target/draft pair to a calibrated, card-carrying head folder: one command, one recipe file."""
from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import typing
from dataclasses import asdict, dataclass, fields
from glob import glob
from pathlib import Path

import yaml
from transformers import HfArgumentParser

from specdecpp.cli import common_field, input_errors, option
from specdecpp.head.folder import CARD_FACTS, record_card_facts, write_card

RECIPE_FILE = "recipe.yaml"
RUN_ONLY = ("nproc_per_node",)  # how the stages run, not what they make: may change between runs


@dataclass
class Recipe:
    """Every setting of `specdecpp head`; a head folder records them as `recipe.yaml`."""

    # the pair and the data
    target: str | None = common_field("target", default=None, help="the target model (required)")
    draft: str | None = common_field("draft", default=None, help="the draft model (required)")
    prompts: str | None = common_field("prompts", default=None, help=(
        "training prompts (required): a registered set (stdlib-train, humaneval), a .json/.jsonl file or Hub dataset"))
    prompts_split: str | None = common_field("prompts_split", default=None, help="split of a Hub dataset")
    n_train: int = option(2000, "training prompts: the source's first n_train")
    n_dev: int = option(200, "dev prompts (training's eval and calibration): the next n_dev")
    max_new_tokens: int = option(512, "target continuation per training/dev prompt")
    batch_size: int = option(8, "prompts per batch and rank while building records")
    do_sample: bool = option(False, "sampled records (a head for sampled decoding) and evaluation; else greedy")
    temperature: float = option(1.0, "sampling temperature (with --do_sample)")
    seed: int = common_field("seed", default=0, help="seed of every stage (sampling draws, the head's weights)")
    torch_dtype: str | None = option(None, "dtype the models run in (default: each command's)")
    trust_remote_code: bool = option(False, "allow models whose code lives in their repo")
    nproc_per_node: int = option(1, "ranks of the distributed stages (records, training): one per GPU, or CPUs")
    # the head and its training
    head_features: list[str] = option(["log_q", "entropy"], "logit features the head reads besides the draft's hidden "
        "state (none: the hidden state alone)")
    num_layers: int = option(3, "residual blocks in the head")
    head_width: int | None = option(None, "project the head's inputs to this width before its blocks (default: none)")
    epochs: float = option(3.0, "training epochs")
    learning_rate: float = option(1e-3, "peak learning rate (cosine schedule)")
    train_batch_size: int = option(4, "records per training step and rank")
    weight_mismatch: float = option(1.0, "the BCE's reject weight; 1 keeps the head calibrated for its threshold")
    cache_hidden_states: bool = option(False, "run the frozen draft once and train on stored states (fast on a CPU)")
    # calibration and the threshold
    bound: list[int] = option([1, 20], "MIN MAX drafted tokens per round the threshold is chosen for")
    step_times_from: str | None = option(None, "price the threshold's replay with the step times stored in this head "
        "folder (or calibration report) instead of timing the pair now, on the machine the head will decode on")
    threads: int = option(1, "torch CPU threads the calibration times the steps with and the short evaluation decodes "
        "with: one count for both, as step times hold only for the thread count they were timed with")
    # the short evaluation
    eval_prompts: str = option("humaneval", "evaluation prompts (from the training source: those after the dev ones)")
    eval_n: int = option(20, "evaluation prompts")
    eval_max_new_tokens: int = option(128, "tokens generated per evaluation prompt")
    eval_num_assistant_tokens: list[int] = option([2, 3, 4], "constant K baselines")
    eval_confidence_thresholds: list[float] = option([0.4, 0.2, 0.6], "our dynamic schedule's confidence thresholds")
    eval_stop_thresholds: list[str] = option(["auto"], "the head's thresholds ('auto': the one calibration stored)")
    eval_baselines: list[str] = option(["target"], "baselines besides our schedules (target, draft, hf:constant, ...)")

    def __post_init__(self):
        hints = typing.get_type_hints(Recipe)
        for f in fields(self):  # a YAML file gives `1e-3` as text and `[auto, 0.3]` as mixed types
            setattr(self, f.name, _coerce(getattr(self, f.name), hints[f.name], f.name))
        if missing := [name for name in ("target", "draft", "prompts") if not getattr(self, name)]:
            raise ValueError(f"the recipe needs {', '.join(missing)} (--{' --'.join(missing)} or in the recipe file)")
        counts = ("n_train", "n_dev", "eval_n", "batch_size", "train_batch_size", "nproc_per_node", "max_new_tokens",
                  "eval_max_new_tokens", "threads")
        if bad := [f"{name} {getattr(self, name)}" for name in counts if getattr(self, name) < 1]:
            raise ValueError(f"must be >= 1: {', '.join(bad)}")
        if len(self.bound) != 2 or not 1 <= self.bound[0] <= self.bound[1]:
            raise ValueError(f"bound must be MIN MAX with 1 <= MIN <= MAX, got {self.bound}")

    @classmethod
    def from_yaml(cls, path: str | Path) -> Recipe:
        """The recipe in the YAML file `path`; ValueError on an unknown key, a bad value or a missing setting."""
        return cls(**recipe_settings(path))

    def to_yaml(self, path: str | Path) -> Path:
        """Write every setting to `path` as YAML, in field order. Returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(asdict(self), sort_keys=False), encoding="utf-8")
        return path

    def changes_from(self, other: Recipe) -> dict[str, tuple]:
        """The settings (besides `RUN_ONLY`) that differ from `other`'s, as `{name: (theirs, ours)}`."""
        ours, theirs = asdict(self), asdict(other)
        return {k: (theirs[k], v) for k, v in ours.items() if k not in RUN_ONLY and theirs[k] != v}


def recipe_settings(path: str | Path) -> dict:
    """The settings a recipe YAML file gives; ValueError naming unknown keys, FileNotFoundError for no file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no recipe file {path}")
    settings = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(settings, dict):
        raise ValueError(f"{path} must be a mapping of recipe settings, got {type(settings).__name__}")
    names = [f.name for f in fields(Recipe)]
    if unknown := sorted(set(settings) - set(names)):
        raise ValueError(f"{path}: unknown recipe setting(s) {', '.join(unknown)}; the settings are {', '.join(names)}")
    return settings


def _coerce(value, kind, name: str):
    """`value` as the field type `kind` (int, float, str, bool, `X | None`, `list[X]`); ValueError naming it."""
    args = typing.get_args(kind)
    if type(None) in args:
        return None if value is None else _coerce(value, next(a for a in args if a is not type(None)), name)
    if typing.get_origin(kind) is list:
        return [_coerce(item, args[0], name) for item in (value if isinstance(value, list) else [value])]
    if kind is bool and not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be {kind.__name__}, got {value!r}") from None


# The settings each stage reads; changing any other (the records') is refused.
STAGE_SETTINGS = {
    "training": ("head_features", "num_layers", "head_width", "epochs", "learning_rate", "train_batch_size",
                 "weight_mismatch", "cache_hidden_states"),
    "calibration": ("bound", "step_times_from", "threads"),  # threads: the evaluation's too, which runs after it
    "evaluation": ("eval_prompts", "eval_n", "eval_max_new_tokens", "eval_num_assistant_tokens",
                   "eval_confidence_thresholds", "eval_stop_thresholds", "eval_baselines"),
}


@dataclass
class Stage:
    """One step of the pipeline: `done` when its result exists, `after` the stages it reads, `results` what to
    remove when that no longer holds, and its `command` (else `action`, run in this process)."""

    name: str
    done: typing.Callable[[], bool]
    after: tuple[str, ...] = ()
    results: tuple[Path, ...] = ()
    command: typing.Callable[[], list[str]] | None = None
    action: typing.Callable[[], None] | None = None

    def invalidate(self) -> None:
        """Remove this stage's results, so that it runs now and in any rerun until it finishes."""
        for path in self.results:
            for match in glob(str(path)):
                shutil.rmtree(match) if Path(match).is_dir() else Path(match).unlink()


class StageError(RuntimeError):
    """A stage's command failed (the message names the stage, its exit status and its command)."""


def launch(module: str, args: list[str], nproc_per_node: int | None = None) -> list[str]:
    """`python -m module args` with this interpreter, under torchrun when `nproc_per_node` is above 1."""
    if nproc_per_node and nproc_per_node > 1:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc_per_node),
                "-m", module, *args]
    return [sys.executable, "-m", module, *args]


def _flag_values(**flags) -> list[str]:
    """`--name value...` for each set flag (None and False left out, True bare)."""
    argv = []
    for name, value in flags.items():
        if value is not None and value is not False:
            argv += [f"--{name}", *([] if value is True else map(str, value if isinstance(value, list) else [value]))]
    return argv


def stages(recipe: Recipe, output_dir: str | Path) -> list[Stage]:
    """The pipeline for `recipe` into the head folder `output_dir`, in the order it runs."""
    out = Path(output_dir)
    data = {"train": out / "data" / "train.jsonl", "dev": out / "data" / "dev.jsonl"}
    evaluation = out / "evaluation"
    models = _flag_values(target=recipe.target, draft=recipe.draft, torch_dtype=recipe.torch_dtype,
                          trust_remote_code=recipe.trust_remote_code)
    sampling = {"do_sample": recipe.do_sample, "temperature": recipe.temperature if recipe.do_sample else None}
    ranges = {"train": (0, recipe.n_train), "dev": (recipe.n_train, recipe.n_train + recipe.n_dev)}
    same_source = recipe.eval_prompts == recipe.prompts  # then evaluate on the prompts after the dev ones
    eval_begin = recipe.n_train + recipe.n_dev if same_source else 0

    def build(split: str) -> Stage:
        begin, end = ranges[split]
        args = models + _flag_values(
            prompts=recipe.prompts, prompts_split=recipe.prompts_split, n_begin=begin, n_end=end, output=data[split],
            max_new_tokens=recipe.max_new_tokens, batch_size=recipe.batch_size, **sampling, seed=recipe.seed)
        return Stage(f"{split} records", done=data[split].is_file,
                     command=lambda: launch("specdecpp.data.build_data", args, recipe.nproc_per_node))

    def train() -> list[str]:  # made when it runs: only then is it known whether a checkpoint is there
        return launch("specdecpp.train", models + _flag_values(
            records=data["train"], eval_records=data["dev"], output=out, head_features=recipe.head_features,
            resnet_num_layers=recipe.num_layers, head_width=recipe.head_width, weight_mismatch=recipe.weight_mismatch,
            num_train_epochs=recipe.epochs, learning_rate=recipe.learning_rate, lr_scheduler_type="cosine",
            per_device_train_batch_size=recipe.train_batch_size, eval_strategy="epoch", save_strategy="epoch",
            save_total_limit=1, seed=recipe.seed, cache_hidden_states=recipe.cache_hidden_states, report_to="none",
            resume_from_checkpoint="True" if _has_checkpoint(out) else None), recipe.nproc_per_node)

    def card_done() -> bool:
        facts, summary = _read_json(out / CARD_FACTS), _read_json(evaluation / "summary.json")
        table = (facts.get("evaluation") or {}).get("table")
        return facts.get("recipe") == asdict(recipe) and table == summary.get("table")

    def write_recipe_card() -> None:
        summary = _read_json(evaluation / "summary.json")
        record_card_facts(out, {"recipe": asdict(recipe),
                                "evaluation": {"title": summary.get("title"), "table": summary.get("table")}})
        write_card(out)

    return [
        build("train"), build("dev"),
        Stage("training", done=lambda: (out / "config.json").is_file() and (out / "model.safetensors").is_file(),
              after=("train records", "dev records"), results=(out / "model.safetensors", out / "checkpoint-*"),
              command=train),
        Stage("calibration", after=("training",), results=(out / "calibration.json",),
              done=lambda: "stop_threshold" in _read_json(out / "config.json") and (out / "calibration.json").is_file(),
              command=lambda: launch("specdecpp.calibration.report", models + _flag_values(
                  head=out, records=data["dev"], choose_threshold=True, bound=recipe.bound, seed=recipe.seed,
                  weight_mismatch=recipe.weight_mismatch, step_times_from=recipe.step_times_from,
                  threads=recipe.threads, output=out / "calibration.json",
                  plot_path=out / "reliability.png"))),  # its rank and threshold plots beside it
        Stage("evaluation", done=(evaluation / "summary.json").is_file, after=("calibration",), results=(evaluation,),
              command=lambda: launch("specdecpp.evaluate", models + _flag_values(
                  head=out, schedule=["constant", "dynamic", "ada"],
                  num_assistant_tokens=recipe.eval_num_assistant_tokens,
                  assistant_confidence_threshold=recipe.eval_confidence_thresholds,
                  stop_threshold=recipe.eval_stop_thresholds, bound=recipe.bound, baselines=recipe.eval_baselines,
                  prompts=recipe.eval_prompts, prompts_split=recipe.prompts_split if same_source else None,
                  n_begin=eval_begin, n_end=eval_begin + recipe.eval_n, max_new_tokens=recipe.eval_max_new_tokens,
                  **sampling, seed=recipe.seed, threads=recipe.threads, output=evaluation, resume=True))),
        Stage("card", done=card_done, after=("evaluation",), action=write_recipe_card),
    ]


def _has_checkpoint(folder: Path) -> bool:
    if not glob(str(folder / "checkpoint-*")):
        return False
    from specdecpp.train import latest_complete_checkpoint  # loads the Trainer: only when there are checkpoints

    try:
        latest_complete_checkpoint(str(folder), report=False)
        return True
    except ValueError:
        return False


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def recipe_changes(recipe: Recipe, output_dir: str | Path) -> set[str]:
    """The settings in which `recipe` differs from `output_dir`'s; ValueError naming changes to the records'."""
    path = Path(output_dir) / RECIPE_FILE
    changed = recipe.changes_from(Recipe.from_yaml(path)) if path.is_file() else {}
    later = {name for names in STAGE_SETTINGS.values() for name in names}
    if fixed := {k: v for k, v in changed.items() if k not in later}:
        raise ValueError(f"{output_dir} holds records made with other settings ("
                         + ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in fixed.items())
                         + f"); rerun with its {RECIPE_FILE}, or choose another --output")
    return set(changed)


def run_recipe(recipe: Recipe, output_dir: str | Path) -> dict[str, str]:
    """Make the head folder `output_dir` from `recipe`, skipping the stages that are done and rerunning those that
    read a rerun one. Returns `{stage: "ran" | "skipped"}`; StageError when a stage fails."""
    changed, pipeline = recipe_changes(recipe, output_dir), stages(recipe, output_dir)
    for stage in pipeline:  # before the new recipe is recorded, so that no interruption hides the change
        if changed & set(STAGE_SETTINGS.get(stage.name, ())):
            stage.invalidate()
    recipe.to_yaml(Path(output_dir) / RECIPE_FILE)
    outcome: dict[str, str] = {}
    for number, stage in enumerate(pipeline, 1):
        prefix = f"[specdecpp head] {number}/{len(pipeline)} {stage.name}:"
        if stage.done():
            print(f"{prefix} done, skipped", flush=True)
            outcome[stage.name] = "skipped"
            continue
        for later in _readers(pipeline, stage.name):
            later.invalidate()
        if stage.action:
            print(f"{prefix} writing", flush=True)
            stage.action()
        else:
            command = stage.command()
            print(f"{prefix} running {shlex.join(command)}", flush=True)
            if (code := subprocess.run(command).returncode) != 0:
                raise StageError(f"stage {stage.name} failed (exit status {code}): {shlex.join(command)}")
        outcome[stage.name] = "ran"
    print(f"[specdecpp head] head folder: {output_dir} (recipe: {Path(output_dir) / RECIPE_FILE})", flush=True)
    return outcome


def _readers(pipeline: list[Stage], name: str) -> list[Stage]:
    readers, names = [], {name}
    for stage in pipeline:
        if names & set(stage.after):
            readers.append(stage)
            names.add(stage.name)
    return readers


@dataclass
class HeadCommandArguments:
    """Where the head goes and which recipe file, if any, gives the settings the flags do not."""

    output: str = common_field("output", aliases=("--output_dir",), help="the head folder to make (or resume)")
    recipe: str | None = option(None, "a recipe YAML file; flags given beside it override it (default: the output "
        "folder's recipe.yaml, when it has one, so rerunning with --output alone resumes)")


FLAGS = (Recipe, HeadCommandArguments)


def parse_args(argv: list[str]) -> tuple[Recipe, HeadCommandArguments]:
    """The recipe from `argv`: the flags over the recipe file's (`--recipe`, else the folder's `recipe.yaml`)."""
    parser = HfArgumentParser(FLAGS, description=__doc__.split("\n\n")[0])
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--recipe")
    early.add_argument("--output", "--output_dir", *common_field("output").metadata["aliases"], dest="output")
    known = early.parse_known_args(argv)[0]
    source = known.recipe or (known.output and Path(known.output, RECIPE_FILE).is_file()
                              and str(Path(known.output, RECIPE_FILE)))
    if source:  # its values become the defaults; Recipe's own checks run on the merged settings
        parser.set_defaults(**recipe_settings(source))
    return parser.parse_args_into_dataclasses(args=argv)


def main(argv: list[str] | None = None) -> None:
    """`specdecpp head [flags]`: run the recipe; exit non-zero with one line on bad input or a failed stage."""
    with input_errors("head"):
        recipe, command = parse_args(sys.argv[1:] if argv is None else argv)
        try:
            run_recipe(recipe, command.output)
        except StageError as error:
            sys.exit(f"specdecpp head: error: {error}")


if __name__ == "__main__":
    main()
