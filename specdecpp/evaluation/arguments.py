"""The evaluation's arguments (`specdecpp evaluate`'s flags), checked before any model loads, and the prompts and pair they name."""
from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from transformers import PreTrainedModel

from specdecpp.checks import (check_can_roll_back, check_head_fits_draft, check_same_vocab, read_head_config,
                              text_config, vocab_size)
from specdecpp.cli import common_field, option
from specdecpp.data.prompts import FORMATS, HUB_DEFAULTS, PROMPT_SETS, load_prompts, tokenize_prompt
from specdecpp.engine.schedules import SCHEDULES
from specdecpp.engine.settings import DecodingSettings, default
from specdecpp.head.model import AcceptancePredictionHead
from specdecpp.models import HeadPairArguments, load_head, load_model, load_tokenizer

ZOO_DIR = Path(__file__).resolve().parent.parent.parent / "checkpoints" / "zoo"
BASELINES = ("target", "draft", "hf:constant", "hf:heuristic", "hf:dynamic")


def zoo_pair(pair: HeadPairArguments) -> HeadPairArguments:
    """`pair` with what it does not name taken from the embedded pair (`checkpoints/zoo`)."""
    return replace(pair, target=pair.target or str(ZOO_DIR / "target"), draft=pair.draft or str(ZOO_DIR / "draft"),
                   head=pair.head or [str(ZOO_DIR / "head")])


@dataclass
class MethodGrid:
    """The methods compared: our schedules, one per K, threshold (per head) and confidence, and the baselines."""

    schedule: list[str] = option(["constant", "ada"], "our engine's schedules to evaluate (several at once); 'none' "
        "runs the baselines only", aliases=["--num_assistant_tokens_schedule"], choices=SCHEDULES)
    num_assistant_tokens: list[int] = option([default("num_assistant_tokens")], "K for constant (one method per "
        "value); heuristic, ours and Hugging Face's, starts from the first")
    assistant_confidence_threshold: list[float] = option([default("assistant_confidence_threshold")], "dynamic: stop "
        "drafting when the draft's token probability falls below this (a method per value; Hugging Face's: the first)")
    dynamic_num_assistant_tokens: int = option(20, "dynamic: the most tokens drafted per round (as Hugging Face's)")
    stop_threshold: list[str] = option([], "ada stop thresholds (one method per value and head); 'auto': each head's "
        f"stored one, priced here (the default where a head stores one, else {default('stop_threshold')})")
    tree_nodes: list[str] = option([str(default("tree_nodes"))], "ada-tree and confidence-tree: the most nodes a tree "
        "drafts (one method per value); 'auto' admits nodes while they pay for their measured cost")
    online: bool = option(False, "ada also with online recalibration (one more method per head and threshold, "
        "'ada-online'): the head's logit corrected from the rounds' outcomes, learning over the prompts in order")
    online_threshold: list[float] = option([0.5], "the online schedule's stop thresholds (vLLM's estimator under ada's "
        "stop rule; one method per value, each one estimator learning over the prompts in order)")
    step_times_from: str | None = option(None, "verify-budget and ada-budget: a head folder (or calibration --output "
        "file) storing the step times that price them (default: the schedule's head, else the first --head with some)")
    baselines: list[str] = option(list(BASELINES), "besides the schedules (the target always runs)", choices=BASELINES)


@dataclass
class DecodingArguments:
    """How every method decodes (`settings()`: the engine's `DecodingSettings`)."""

    bound: list[int] | None = option(None, "ada: MIN MAX drafted tokens per round (default: the bound a head's "
        f"threshold selection was made with, else {' '.join(map(str, default('bound')))})")
    max_new_tokens: int = option(default("max_new_tokens"), "tokens generated per prompt at most")
    do_sample: bool = option(default("do_sample"), "sample instead of greedy decoding")
    temperature: float = default("temperature")
    top_k: int = default("top_k")
    top_p: float = default("top_p")
    repetition_penalty: float = option(1.0, "generate's repetition penalty (1: off), for every method, Hugging Face's "
        "baselines included; ada's 'auto' threshold fits best when chosen on records built with the same")
    tree_width: int = option(default("tree_width"), "ada-tree and confidence-tree: children per expanded node")
    compile: bool = option(default("compile"), "run our methods (the target and draft alone included) on the compiled "
        "engine: static caches, each step one torch.compile'd graph, compiled in the (reported, untimed) warm-up")

    def settings(self) -> DecodingSettings:
        return DecodingSettings(**asdict(self) | {"bound": tuple(self.bound) if self.bound is not None else None})


@dataclass
class PromptSource:
    """Which prompts, and how they are shown to the model."""

    prompts: str = common_field("prompts", aliases=("--data_path",), default="humaneval", help=(
        "a prompt set (humaneval, ...), a .json/.jsonl file, or a Hub dataset"))
    prompts_split: str | None = common_field("prompts_split", default=None, help="Hub dataset split (None: its usual)")
    prompt_format: str = option("auto", "how prompts are shown to the model", choices=FORMATS)
    n_begin: int = option(0, "first prompt index")
    n_end: int | None = option(None, "one past the last prompt index (default: all)")
    max_length: int | None = option(None, "the reference's cap on prompt + new tokens; overrides --max_new_tokens")


@dataclass
class RunOptions:
    """Where a run's results go and how it measures."""

    output: str = common_field("output", default="outputs/evaluate", help="folder for records, summary and plots")
    seed: int = common_field("seed", default=47, help="seeds each prompt's sampling (the seed plus the prompt index)")
    warmup_tokens: int = option(16, "tokens each method first generates on the first prompt, untimed (0: none)")
    cost_steps_per_prompt: int = option(5, "draft steps and verifications timed after each prompt for the cost ratio c")
    plots: bool = option(True, "draw the PNG figures (--no_plots to skip)")
    progress: bool = option(True, "show a progress bar (--no_progress to hide)")
    resume: bool = option(False, "keep the prompts already in --output's records file (an interrupted run with the "
        "same flags) and run only the rest")
    overwrite: bool = option(False, "replace the records already in --output's records file (without --resume or this, "
        "a run refuses to start over finished prompts)")


def check_inputs(pair: HeadPairArguments, grid: MethodGrid, decoding: DecodingSettings, source: PromptSource,
                 run: RunOptions) -> None:
    """ValueError, naming the flags, on settings that cannot work, before anything is loaded."""
    if run.resume and run.overwrite:
        raise ValueError("--resume keeps the finished prompts and --overwrite replaces them: pass one of them")
    check_decoding_flags(grid, decoding)
    if decoding.max_new_tokens < 1 or (source.max_length is not None and source.max_length < 2):
        raise ValueError("--max_new_tokens must be >= 1 (and --max_length >= 2)")
    check_prompt_source(source.prompts)
    draft_config, target_config = _model_config(pair.draft), _model_config(pair.target)
    if draft_config is not None and target_config is not None:
        check_same_vocab(target_config.vocab_size, draft_config.vocab_size)
    if grid.online and not any(SCHEDULES[schedule].recalibrates for schedule in grid.schedule):
        raise ValueError("--online recalibrates a head online: add ada to --schedule")
    if head_schedules := [schedule for schedule in grid.schedule if SCHEDULES[schedule].needs_head]:
        if not pair.head:
            raise ValueError(f"schedule {head_schedules[0]!r} needs --head (a trained acceptance prediction head)")
        for head_dir in pair.head:
            _check_head(head_dir, draft_config)
    if "ada" in grid.schedule and "auto" in grid.stop_threshold and not any(map(may_store_threshold, pair.head)):
        raise ValueError("--stop_threshold auto needs a head with a stored threshold, and none of "
                         f"{', '.join(pair.head)} has one: choose one with "
                         "`python -m specdecpp.calibration.report ... --choose_threshold`")
    for schedule in grid.schedule:  # a schedule with a head reads its own head's step times
        policy = SCHEDULES[schedule]
        prices = policy.needs_step_times or (policy.grows_tree and "auto" in grid.tree_nodes)
        if prices and not policy.needs_head and budget_step_times_from(grid, schedule, pair.head or []) is None:
            raise ValueError(f"{schedule} prices its rounds with measured step times, and no --head folder "
                             f"({', '.join(pair.head or []) or 'none given'}) stores them: pass --step_times_from a "
                             "head folder (or calibration --output file) whose threshold was chosen with timed steps")
    check_writable(run.output)


def budget_step_times_from(grid: MethodGrid, schedule: str, heads: list[str]) -> str | None:
    """`--step_times_from`, else (for a headless schedule) the first of `heads` storing step times; None: its head's."""
    if grid.step_times_from is not None or SCHEDULES[schedule].needs_head:
        return grid.step_times_from
    return next((head_dir for head_dir in heads if stores_step_times(head_dir)), None)


def _local_config(head_dir: str) -> dict | None:
    """The `config.json` of a local head folder; None for a Hub id (or no such file)."""
    config_file = os.path.join(head_dir, "config.json")
    return json.loads(Path(config_file).read_text(encoding="utf-8")) if os.path.isfile(config_file) else None


def stores_step_times(head_dir: str) -> bool:
    """Whether `head_dir` is a local head folder whose threshold selection stores step times."""
    return "judged_step_times" in ((_local_config(head_dir) or {}).get("threshold_selection") or {})


def may_store_threshold(head_dir: str) -> bool:
    """False for a local head folder without a stored threshold; a Hub id is checked once loaded."""
    return (config := _local_config(head_dir)) is None or config.get("stop_threshold") is not None


def check_decoding_flags(grid: MethodGrid, decoding: DecodingSettings) -> None:
    """`DecodingSettings.validate` on every schedule, K, threshold and confidence of the grid, naming flags."""
    for schedule in dict.fromkeys(["constant", *grid.schedule]):
        thresholds = grid.online_threshold if schedule == "online" else \
            [_as_threshold(t) for t in grid.stop_threshold] or [None]  # none: each head's default
        policy = SCHEDULES[schedule]
        if policy.grows_tree and not policy.needs_head:  # 'auto' is a head's threshold: a method per number only
            thresholds = [t for t in thresholds if t != "auto"]
        sizes = [int(n) if n.isdigit() else n for n in grid.tree_nodes] if policy.grows_tree \
            else [default("tree_nodes")]
        for k, t, c, n in itertools.product(grid.num_assistant_tokens, thresholds, grid.assistant_confidence_threshold,
                                            sizes):
            replace(decoding, schedule=schedule, stop_threshold=t, num_assistant_tokens=k,
                    assistant_confidence_threshold=c, tree_nodes=n).validate(lambda name: "--" + (
                        "online_threshold" if schedule == "online" and name == "stop_threshold" else name))
    replace(decoding, schedule="dynamic", num_assistant_tokens=grid.dynamic_num_assistant_tokens).validate(
        lambda name: "--" + ("dynamic_" + name if name == "num_assistant_tokens" else name))


def _as_threshold(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def check_prompt_source(source: str) -> None:
    """Fail at once on a prompt source that is no prompt set, no file and no Hub dataset id."""
    if source in PROMPT_SETS or source in HUB_DEFAULTS or os.path.isfile(source):
        return
    if source.endswith((".json", ".jsonl")) or _is_local_path(source):
        raise FileNotFoundError(f"no prompt file at {source}")
    if "/" not in source:
        raise ValueError(f"unknown prompt set {source!r}; choose from {', '.join(PROMPT_SETS)}, "
                         "or give a .json/.jsonl file or a Hub dataset id (org/name)")


def _model_config(name_or_path: str):
    """The text config of a local model folder, or None for a Hub id (checked once loaded)."""
    if os.path.isdir(name_or_path):
        return text_config(name_or_path)
    if _is_local_path(name_or_path):
        raise FileNotFoundError(f"no model folder at {name_or_path}{_zoo_hint(name_or_path)}")
    return None


def _is_local_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or os.path.exists(name)


def _zoo_hint(path: str) -> str:
    if not Path(path).resolve().is_relative_to(ZOO_DIR.resolve()):
        return ""
    return (f" (the embedded pair is expected in {ZOO_DIR}, inside a checkout of the repository, where "
            "`specdecpp zoo` builds it; elsewhere point at a pair: --target TARGET --draft DRAFT --head HEAD)")


def _check_head(head_dir: str, draft_config) -> None:
    if not os.path.isdir(head_dir):
        if _is_local_path(head_dir):
            raise FileNotFoundError(f"no head folder at {head_dir}{_zoo_hint(head_dir)}")
        return  # a Hub id: checked once loaded
    head_hidden = read_head_config(head_dir)["hidden_size"]
    if draft_config is not None:
        check_head_fits_draft(head_hidden, draft_config.hidden_size, f"the head in {head_dir}")


def check_writable(path: str) -> None:
    """Create `path` and write a file into it, or ValueError; folders made only for the check are removed."""
    created = None  # the outermost missing folder
    folder = os.path.abspath(path)
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        created, folder = folder, os.path.dirname(folder)
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        raise ValueError(f"cannot write results to --output {path}: {error}") from None
    finally:
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)


@dataclass
class Prompt:
    """One prompt: its index in the source, its text, its token ids and its generation budget."""

    id: int
    text: str
    ids: list[int]
    max_new_tokens: int


def load_eval_prompts(source: PromptSource, tokenizer, max_new_tokens: int) -> list[Prompt]:
    """The prompts `[n_begin:n_end]`, formatted and tokenized, less those already `max_length` long."""
    try:
        texts = load_prompts(source.prompts, source.prompts_split, source.n_begin, source.n_end)
    except (FileNotFoundError, ValueError):
        raise
    except Exception as error:  # a name that is no prompt set, no file, and no reachable Hub dataset
        raise ValueError(f"cannot read prompts from {source.prompts!r}: not a prompt set, not a file, and "
                         f"loading it as a Hub dataset failed ({type(error).__name__}: {error})") from None
    prompts = []
    for i, text in enumerate(texts, start=source.n_begin):
        formatted, ids = tokenize_prompt(text, tokenizer, source.prompt_format)
        budget = max_new_tokens if source.max_length is None else source.max_length - len(ids)
        if budget > 0:
            prompts.append(Prompt(i, formatted, ids, budget))
    if not prompts:
        raise ValueError(f"every prompt is already --max_length {source.max_length} tokens long")
    return prompts


@dataclass
class Pair:
    """The loaded models: target, draft, the heads by folder or Hub id (none without ada) and the tokenizer."""

    target: PreTrainedModel
    draft: PreTrainedModel
    heads: dict[str, AcceptancePredictionHead]
    tokenizer: object


def load_pair(pair: HeadPairArguments, tokenizer, need_head: bool) -> Pair:
    """Load target, draft and (when `need_head`) the heads, and check that they fit together."""
    target, draft = (load_model(name, **pair.loading()) for name in (pair.target, pair.draft))
    check_same_vocab(vocab_size(target), vocab_size(draft))
    for model, role in ((target, "the target"), (draft, "the draft")):
        check_can_roll_back(model, role)
    heads = {head_dir: load_head(head_dir).to(draft.device) for head_dir in (pair.head if need_head else [])}
    return Pair(target, draft, heads, tokenizer)


def results_file(output: str | Path, prompts: list[Prompt]) -> Path:
    """The reference's file name, `results_{n_begin}to{n_end}.json`, for these prompts."""
    return Path(output) / f"results_{prompts[0].id}to{prompts[-1].id + 1}.json"


def check_results_replaceable(path: Path, overwrite: bool) -> None:
    """ValueError on a results file holding records, unless `overwrite`."""
    if path.is_file() and path.stat().st_size > 0 and not overwrite:
        raise ValueError(f"{path} holds the records of an earlier run: pass --resume to keep them and run only the "
                         "missing prompts, --overwrite to replace them, or choose another --output")


def load_inputs(pair: HeadPairArguments, grid: MethodGrid, decoding: DecodingSettings, source: PromptSource,
                run: RunOptions) -> tuple[object, list[Prompt]]:
    """Check the settings; returns the tokenizer and the prompts."""
    check_inputs(pair, grid, decoding, source, run)
    tokenizer = load_tokenizer(pair.target, trust_remote_code=pair.trust_remote_code)
    return tokenizer, load_eval_prompts(source, tokenizer, decoding.max_new_tokens)
