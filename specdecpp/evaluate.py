"""Evaluate candidate-length schedules against baselines on one target/draft pair.

`python specdecpp/evaluate.py --model_name TARGET --assistant_name DRAFT --schedule ada
--assist_acc_head_dir HEAD --stop_threshold 0.3 --bound 2 20 --data_path humaneval --save_path OUT`
(also `specdecpp evaluate ...`). Several schedules, K values and thresholds run in one go
(`--schedule constant ada dynamic --stop_threshold 0.1 0.3 0.5 0.7`), next to the baselines
measured in the same run: the target alone, the draft alone, and Hugging Face's own
`generate(assistant_model=...)` with its constant, heuristic and dynamic schedules.

Honest measurement (DESIGN section 4): every method runs on every prompt, methods interleaved
per prompt (their order rotating) so that drift of the machine hits all alike; each method is
warmed up once before anything is timed; speedups are paired with the target-alone time of the
same prompt; the draft/target cost ratio c is timed after every prompt, so load hits it as it
hits the methods. Target calls, draft calls and discarded tokens are counted for every method —
for Hugging Face's by counting the models' forward passes. Greedy runs check, prompt by prompt,
that every speculative method's output equals the target's.

Output in `--save_path`: `results_{n_begin}to{n_end}.json` (one record per prompt and method,
the reference's fields plus ours), `summary.json` (the table below, the measured cost ratio,
the greedy verdict, the settings), `pareto.png` and `speedup_vs_threshold.png`.
Records are saved after every prompt; `--resume` reruns an interrupted run with the same flags,
keeping the prompts it finished.
"""
from __future__ import annotations

import copy
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoConfig, HfArgumentParser, PreTrainedModel

from specdecpp import metrics, plots
from specdecpp.decoding import speculative_generate
from specdecpp.head import AcceptancePredictionHead
from specdecpp.models import ModelLoadingArguments, check_same_vocab, is_peft_adapter, load_model, load_tokenizer
from specdecpp.prompts import FORMATS, HUB_DEFAULTS, PROMPT_SETS, load_prompts, tokenize_prompt
from specdecpp.schedules import SCHEDULES

ZOO_DIR = Path(__file__).resolve().parent.parent / "checkpoints" / "zoo"
BASELINES = ("target", "draft", "hf:constant", "hf:heuristic", "hf:dynamic")


@dataclass
class EvaluationArguments:
    """The reference's flags (`--model_name`, `--assistant_name`, `--num_assistant_tokens_schedule`,
    ...) with lists where a sweep makes sense, plus the baselines and measurement settings."""

    model_name: str = field(default=str(ZOO_DIR / "target"), metadata={"help": "target model: Hub id or folder"})
    assistant_name: str = field(default=str(ZOO_DIR / "draft"), metadata={"help": "draft model: Hub id or folder"})
    schedule: list[str] = field(default_factory=lambda: ["constant", "ada"], metadata={
        "aliases": ["--num_assistant_tokens_schedule"], "choices": SCHEDULES,
        "help": "our engine's schedules to evaluate (several at once); 'none' runs the baselines only"})
    num_assistant_tokens: list[int] = field(default_factory=lambda: [5], metadata={
        "help": "K for constant (one method per value); heuristic, ours and Hugging Face's, starts from the first"})
    assistant_confidence_threshold: list[float] = field(default_factory=lambda: [0.4], metadata={
        "help": "dynamic: stop drafting when the draft's token probability falls below this (one method of ours "
                "per value; Hugging Face's dynamic starts from the first and moves it itself)"})
    dynamic_num_assistant_tokens: int = field(default=20, metadata={
        "help": "dynamic: the most tokens drafted per round (Hugging Face's default, 20)"})
    assist_acc_head_dir: list[str] = field(default_factory=lambda: [str(ZOO_DIR / "head")], metadata={
        "help": "acceptance prediction heads for ada (folders or Hub ids; ada runs with each)"})
    stop_threshold: list[str] = field(default_factory=lambda: ["0.3"], metadata={
        "help": "ada stop thresholds (one method per value and head); 'auto' uses the threshold stored in each "
                "head that has one"})
    bound: list[int] = field(default_factory=lambda: [2, 20], metadata={
        "help": "ada: MIN MAX drafted tokens per round"})
    baselines: list[str] = field(default_factory=lambda: list(BASELINES), metadata={
        "choices": BASELINES, "help": "baselines run next to the schedules (the target alone always runs)"})
    data_path: str = field(default="humaneval", metadata={
        "help": "prompts: a prompt set name (humaneval, ...), a .json/.jsonl file, or a Hub dataset"})
    data_split: str | None = field(default=None, metadata={
        "help": "Hub dataset split (default: the dataset's usual one)"})
    prompt_format: str = field(default="auto", metadata={
        "choices": FORMATS, "help": "how prompts are shown to the model"})
    n_begin: int = field(default=0, metadata={"help": "first prompt index"})
    n_end: int | None = field(default=None, metadata={"help": "one past the last prompt index (default: all)"})
    save_path: str = field(default="outputs/evaluate", metadata={"help": "folder for records, summary and plots"})
    max_new_tokens: int = field(default=128, metadata={"help": "tokens generated per prompt at most"})
    max_length: int | None = field(default=None, metadata={
        "help": "the reference's limit on prompt + generated tokens; overrides --max_new_tokens when given"})
    do_sample: bool = field(default=False, metadata={"help": "sample instead of greedy decoding"})
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    random_seed: int = field(default=47, metadata={"help": "seeds torch and each prompt's sampling"})
    warmup_tokens: int = field(default=16, metadata={
        "help": "each method first generates this many tokens on the first prompt, untimed (0: no warm-up)"})
    cost_steps_per_prompt: int = field(default=5, metadata={
        "help": "draft steps and target verifications timed after each prompt for the cost ratio c"})
    threads: int = field(default=0, metadata={
        "help": "torch CPU threads (0: torch's default); small models run as fast on one, which also keeps "
                "other processes on a shared machine from slowing the run down"})
    plots: bool = field(default=True, metadata={"help": "draw the PNG figures (--no_plots to skip)"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar (--no_progress to hide)"})
    resume: bool = field(default=False, metadata={
        "help": "keep the prompts already in --save_path's records file (an interrupted run with the same "
                "flags) and run only the rest"})


# -- checks that need no model ------------------------------------------------------------------
def check_arguments(args: EvaluationArguments) -> None:
    """Raise ValueError on settings that cannot work, before anything is loaded: a bound out of
    order, a K or threshold out of range, an unknown prompt source, ada without a head, a head
    trained for a draft of another hidden size, models with different vocabularies, the oracle
    with sampling, a save path that cannot be written."""
    if len(args.bound) != 2 or not 0 <= args.bound[0] <= args.bound[1] or args.bound[1] < 1:
        raise ValueError("--bound takes MIN MAX with 0 <= MIN <= MAX and MAX >= 1, got "
                         + " ".join(map(str, args.bound)))
    if any(k < 1 for k in args.num_assistant_tokens) or args.dynamic_num_assistant_tokens < 1:
        raise ValueError("--num_assistant_tokens and --dynamic_num_assistant_tokens must be >= 1")
    if any(t != "auto" and not _is_fraction(t) for t in args.stop_threshold) \
            or not all(0.0 <= t <= 1.0 for t in args.assistant_confidence_threshold):
        raise ValueError("--stop_threshold (or 'auto') and --assistant_confidence_threshold must lie in [0, 1]")
    if args.max_new_tokens < 1 or (args.max_length is not None and args.max_length < 2):
        raise ValueError("--max_new_tokens must be >= 1 (and --max_length >= 2)")
    if "oracle" in args.schedule and args.do_sample:
        raise ValueError("the oracle schedule is defined for greedy decoding only: drop --do_sample or oracle")
    check_prompt_source(args.data_path)
    draft_config = _model_config(args.assistant_name)
    target_config = _model_config(args.model_name)
    if draft_config is not None and target_config is not None:
        target_vocab, draft_vocab = target_config.vocab_size, draft_config.vocab_size
        if target_vocab != draft_vocab:
            raise ValueError(f"target vocabulary ({target_vocab}) and draft vocabulary ({draft_vocab}) differ: "
                             "the draft must share the target's tokenizer")
    if "ada" in args.schedule:
        if not args.assist_acc_head_dir:
            raise ValueError("schedule 'ada' needs --assist_acc_head_dir (a trained acceptance prediction head)")
        for head_dir in args.assist_acc_head_dir:
            _check_head(head_dir, draft_config)
        if "auto" in args.stop_threshold and not any(map(_may_store_threshold, args.assist_acc_head_dir)):
            raise ValueError("--stop_threshold auto needs a head with a stored threshold, and none of "
                             f"{', '.join(args.assist_acc_head_dir)} has one: choose one with "
                             "`python -m specdecpp.calibration ... --choose_threshold`")
    check_writable(args.save_path)


def _may_store_threshold(head_dir: str) -> bool:
    """False for a local head folder without a stored threshold; a Hub id is checked once loaded."""
    config_file = os.path.join(head_dir, "config.json")
    if not os.path.isfile(config_file):
        return True
    with open(config_file, encoding="utf-8") as f:
        return json.load(f).get("stop_threshold") is not None


def _is_fraction(text: str) -> bool:
    try:
        return 0.0 <= float(text) <= 1.0
    except ValueError:
        return False


def check_prompt_source(source: str) -> None:
    """Fail at once on a prompt source that is neither a prompt set, nor an existing file, nor
    shaped like a Hub dataset id (`org/name`): asking the Hub about it would only time out here."""
    if source in PROMPT_SETS or source in HUB_DEFAULTS or os.path.isfile(source):
        return
    if source.endswith((".json", ".jsonl")) or _is_local_path(source):
        raise FileNotFoundError(f"no prompt file at {source}")
    if "/" not in source:
        raise ValueError(f"unknown prompt set {source!r}; choose from {', '.join(PROMPT_SETS)}, "
                         "or give a .json/.jsonl file or a Hub dataset id (org/name)")


def _model_config(name_or_path: str):
    """The text config of a local model folder (a PEFT adapter's base), or None for a Hub id,
    which is checked once loaded instead."""
    if os.path.isdir(name_or_path):
        if is_peft_adapter(name_or_path):
            from peft import PeftConfig

            name_or_path = PeftConfig.from_pretrained(name_or_path).base_model_name_or_path
        return AutoConfig.from_pretrained(name_or_path).get_text_config()
    if _is_local_path(name_or_path):
        raise FileNotFoundError(f"no model folder at {name_or_path}{_zoo_hint(name_or_path)}")
    return None


def _is_local_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or os.path.exists(name)


def _zoo_hint(path: str) -> str:
    return " (the embedded pair is built by `specdecpp zoo`)" if Path(path).resolve().is_relative_to(ZOO_DIR) else ""


def _check_head(head_dir: str, draft_config) -> None:
    if not os.path.isdir(head_dir):
        if _is_local_path(head_dir):
            raise FileNotFoundError(f"no head folder at {head_dir}{_zoo_hint(head_dir)}")
        return  # a Hub id: checked once loaded
    config_file = os.path.join(head_dir, "config.json")
    if not os.path.isfile(config_file):
        raise FileNotFoundError(f"{head_dir} holds no config.json: not an acceptance prediction head")
    with open(config_file, encoding="utf-8") as f:
        head_hidden = json.load(f).get("hidden_size")
    if draft_config is not None and head_hidden != draft_config.hidden_size:
        raise ValueError(f"the head in {head_dir} reads hidden states of size {head_hidden}, but the draft's hidden "
                         f"size is {draft_config.hidden_size}: it was trained for another draft")


def check_writable(path: str) -> None:
    """Create `path` and write a file into it, or raise ValueError saying why it cannot be used."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        raise ValueError(f"cannot write results to --save_path {path}: {error}") from None


# -- prompts ------------------------------------------------------------------------------------
@dataclass
class Prompt:
    """One prompt: its index in the source, its text as the model sees it, its token ids and
    how many tokens may be generated for it."""

    id: int
    text: str
    ids: list[int]
    max_new_tokens: int


def load_eval_prompts(args: EvaluationArguments, tokenizer) -> list[Prompt]:
    """The prompts `[n_begin:n_end]` of `--data_path`, formatted and tokenized. With the reference's
    `--max_length` (prompt + generated), prompts already that long are left out."""
    try:
        texts = load_prompts(args.data_path, args.data_split, args.n_begin, args.n_end)
    except (FileNotFoundError, ValueError):
        raise
    except Exception as error:  # a name that is no prompt set, no file, and no reachable Hub dataset
        raise ValueError(f"cannot read prompts from {args.data_path!r}: not a prompt set, not a file, and "
                         f"loading it as a Hub dataset failed ({type(error).__name__}: {error})") from None
    prompts = []
    for i, text in enumerate(texts, start=args.n_begin):
        formatted, ids = tokenize_prompt(text, tokenizer, args.prompt_format)
        budget = args.max_new_tokens if args.max_length is None else args.max_length - len(ids)
        if budget > 0:
            prompts.append(Prompt(i, formatted, ids, budget))
    if not prompts:
        raise ValueError(f"every prompt is already --max_length {args.max_length} tokens long")
    return prompts


# -- methods ------------------------------------------------------------------------------------
@dataclass
class MethodSpec:
    """What a method is: `target`, `draft`, `specdecpp:<schedule>[@...]` or `hf:<schedule>[@...]`."""

    name: str
    engine: str | None  # "specdecpp" or "hf"; None for a model alone
    schedule: str
    num_assistant_tokens: int | None = None
    stop_threshold: float | str | None = None  # "auto" until the head is loaded (see `build_method`)
    head: str | None = None  # the ada head's folder or Hub id
    assistant_confidence_threshold: float | None = None


@dataclass
class Counts:
    """What one generation produced and cost, in forward passes (None where unknown)."""

    tokens: list[int]
    target_calls: int | None
    draft_calls: int | None
    discarded_tokens: int | None
    accepted_lengths: list[int] | None


@dataclass
class Method:
    spec: MethodSpec
    generate: Callable[[Prompt, int], Counts]  # (prompt, seed) -> counts


def method_specs(args: EvaluationArguments) -> list[MethodSpec]:
    """The methods the flags ask for: baselines first, then one per schedule and knob value."""
    specs = [MethodSpec("target", None, "none")]
    if "draft" in args.baselines:
        specs.append(MethodSpec("draft", None, "none"))
    for schedule in ("constant", "heuristic", "dynamic"):
        if f"hf:{schedule}" in args.baselines:
            specs += _knob_specs("hf", schedule, args)
    for schedule in dict.fromkeys(args.schedule):
        if schedule != "none":
            specs += _knob_specs("specdecpp", schedule, args)
    return specs


def _knob_specs(engine: str, schedule: str, args: EvaluationArguments) -> list[MethodSpec]:
    """One spec per K (constant), per threshold (ada), or a single one."""
    if schedule == "constant":
        return [MethodSpec(f"{engine}:constant@K={k}", engine, schedule, num_assistant_tokens=k)
                for k in dict.fromkeys(args.num_assistant_tokens)]
    if schedule == "heuristic":  # it adapts K itself: one starting point is enough
        k = args.num_assistant_tokens[0]
        return [MethodSpec(f"{engine}:heuristic@K={k}", engine, schedule, num_assistant_tokens=k)]
    if schedule == "ada":
        heads = list(dict.fromkeys(args.assist_acc_head_dir))
        # "auto" runs with every head that stores a threshold (see `_may_store_threshold`)
        return [MethodSpec(f"{engine}:ada" + (f"[{head_label(head)}]" if len(heads) > 1 else "")
                           + f"@{t if t == 'auto' else format(float(t), 'g')}", engine, schedule,
                           stop_threshold=t if t == "auto" else float(t), head=head)
                for head in heads for t in dict.fromkeys(args.stop_threshold)
                if t != "auto" or _may_store_threshold(head)]
    if schedule == "dynamic":
        confidences = list(dict.fromkeys(args.assistant_confidence_threshold))
        if engine == "hf":  # it moves its threshold itself: one starting point is enough
            confidences = confidences[:1]
        return [MethodSpec(f"{engine}:dynamic" + (f"@{c:g}" if len(confidences) > 1 else ""), engine, schedule,
                           num_assistant_tokens=args.dynamic_num_assistant_tokens, assistant_confidence_threshold=c)
                for c in confidences]
    return [MethodSpec(f"{engine}:{schedule}", engine, schedule)]


def head_label(head_dir: str) -> str:
    """A head's short name in method names: its folder's (or Hub repo's) last part."""
    return Path(head_dir.rstrip("/")).name


@dataclass
class Pair:
    """The loaded models: target, draft, the heads by folder or Hub id (none without ada) and the tokenizer."""

    target: PreTrainedModel
    draft: PreTrainedModel
    heads: dict[str, AcceptancePredictionHead]
    tokenizer: object


def load_pair(args: EvaluationArguments, model_args: ModelLoadingArguments, tokenizer, need_head: bool) -> Pair:
    """Load target, draft and (when `need_head`) the head, and check that they fit together."""
    load = dict(torch_dtype=model_args.torch_dtype, device_map=model_args.device_map,
                trust_remote_code=model_args.trust_remote_code)
    target = load_model(args.model_name, **load)
    draft = load_model(args.assistant_name, **load)
    check_same_vocab(target, draft)
    # A head from the Hub (not checked beforehand) meets the engine's hidden-size check at warm-up.
    heads = {head_dir: AcceptancePredictionHead.from_pretrained(head_dir).to(draft.device)
             for head_dir in (args.assist_acc_head_dir if need_head else [])}
    return Pair(target, draft, heads, tokenizer)


def build_method(spec: MethodSpec, pair: Pair, args: EvaluationArguments) -> Method:
    """A runnable method for `spec` on `pair`, with the decoding settings of `args`; an ada
    threshold of "auto" becomes the number stored in the spec's head."""
    if spec.engine == "hf":
        return Method(spec, _hf_generate(spec, pair, args))
    if spec.engine is None:
        model = pair.target if spec.name == "target" else pair.draft
        return Method(spec, _engine_generate(spec, model, None, None, args))
    head = pair.heads.get(spec.head)
    if head is not None:
        spec = replace(spec, stop_threshold=head.resolve_stop_threshold(spec.stop_threshold))
    return Method(spec, _engine_generate(spec, pair.target, pair.draft, head, args))


def _sampling_kwargs(args: EvaluationArguments) -> dict:
    return dict(do_sample=True, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p) if args.do_sample \
        else dict(do_sample=False)


def _engine_generate(spec: MethodSpec, target: PreTrainedModel, draft: PreTrainedModel | None,
                     head: AcceptancePredictionHead | None,
                     args: EvaluationArguments) -> Callable[[Prompt, int], Counts]:
    """Our engine with `spec`'s schedule; a model alone (`schedule="none"`) runs through the same
    loop, its forward passes counted as target calls for the target and draft calls for the draft."""
    knobs = {k: v for k, v in (("num_assistant_tokens", spec.num_assistant_tokens),
                               ("stop_threshold", spec.stop_threshold),
                               ("assistant_confidence_threshold", spec.assistant_confidence_threshold)) if v is not None}
    alone_is_draft = spec.engine is None and spec.name == "draft"

    def generate(prompt: Prompt, seed: int) -> Counts:
        device = target.get_input_embeddings().weight.device
        generator = torch.Generator(device).manual_seed(seed)
        out = speculative_generate(target, draft, torch.tensor([prompt.ids], device=device), schedule=spec.schedule,
                                   head=head, bound=tuple(args.bound), max_new_tokens=prompt.max_new_tokens, generator=generator,
                                   **knobs, **_sampling_kwargs(args))
        stats = out.stats
        tokens = out.sequences[0, len(prompt.ids):].tolist()
        if spec.engine is None:
            calls = (0, stats.target_calls) if alone_is_draft else (stats.target_calls, 0)
            return Counts(tokens, *calls, discarded_tokens=0, accepted_lengths=None)
        return Counts(tokens, stats.target_calls, stats.draft_calls, stats.discarded_tokens,
                      list(stats.accepted_lengths))

    return generate


# -- Hugging Face's assisted generation, counted from the outside ------------------------------
HF_SCHEDULES = ("constant", "heuristic", "dynamic")


def hf_assistant_settings(spec: MethodSpec, args: EvaluationArguments) -> dict:
    """Hugging Face's assistant generation settings for one of its schedules. Its `dynamic` is
    the `constant` schedule (at most K) with the confidence stop; a zero threshold turns that
    stop off for the other two, which would otherwise inherit the 0.4 default."""
    if spec.schedule not in HF_SCHEDULES:
        raise ValueError(f"Hugging Face has no {spec.schedule!r} schedule; choose from {', '.join(HF_SCHEDULES)}")
    dynamic = spec.schedule == "dynamic"
    return {"num_assistant_tokens": spec.num_assistant_tokens,
            "num_assistant_tokens_schedule": "heuristic" if spec.schedule == "heuristic" else "constant",
            "assistant_confidence_threshold": spec.assistant_confidence_threshold if dynamic else 0.0}


def _hf_generate(spec: MethodSpec, pair: Pair, args: EvaluationArguments) -> Callable[[Prompt, int], Counts]:
    """`target.generate(assistant_model=draft)` with one of Hugging Face's schedules. It reads the
    schedule from the draft's generation config, so each method owns a copy of that config and
    swaps it in for its calls (Hugging Face's `heuristic` carries its K from call to call inside
    that copy, as it does for a user; `dynamic` moves its threshold by ROC within a call)."""
    target, draft = pair.target, pair.draft
    config = copy.deepcopy(draft.generation_config)
    for name, value in hf_assistant_settings(spec, args).items():
        setattr(config, name, value)
    eos = target.generation_config.eos_token_id
    pad = target.generation_config.pad_token_id
    if pad is None and eos is not None:  # else Hugging Face warns that it picks one
        pad = eos[0] if isinstance(eos, list) else eos
    extra = {"pad_token_id": pad} if pad is not None else {}

    def generate(prompt: Prompt, seed: int) -> Counts:
        device = target.get_input_embeddings().weight.device
        input_ids = torch.tensor([prompt.ids], device=device)
        torch.manual_seed(seed)
        with _generation_config(draft, config), count_forwards(target) as target_calls, \
                count_forwards(draft) as draft_calls:
            sequences = target.generate(input_ids, attention_mask=torch.ones_like(input_ids), assistant_model=draft,
                                        max_new_tokens=prompt.max_new_tokens, **_sampling_kwargs(args), **extra)
        tokens = sequences[0, len(prompt.ids):].tolist()
        accepted, drafted = rounds_from_target_calls(target_calls, len(prompt.ids), len(tokens))
        return Counts(tokens, len(target_calls), len(draft_calls), sum(drafted) - sum(accepted), accepted)

    return generate


@contextmanager
def _generation_config(model: PreTrainedModel, config) -> Iterator[None]:
    saved, model.generation_config = model.generation_config, config
    try:
        yield
    finally:
        model.generation_config = saved


@contextmanager
def count_forwards(model: PreTrainedModel) -> Iterator[list[tuple[int, int]]]:
    """Within the block, append `(new tokens, cached tokens)` to the yielded list at each forward
    pass of `model` (the KV cache length is read before the pass extends it)."""
    calls: list[tuple[int, int]] = []

    def hook(module, args, kwargs):
        input_ids = kwargs["input_ids"] if kwargs.get("input_ids") is not None else args[0]
        cache = kwargs.get("past_key_values")
        calls.append((input_ids.shape[1], cache.get_seq_length() if cache is not None else 0))

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield calls
    finally:
        handle.remove()


def rounds_from_target_calls(calls: list[tuple[int, int]], prompt_length: int,
                             generated: int) -> tuple[list[int], list[int]]:
    """Per round (one target forward each): drafted tokens accepted, and tokens drafted. A round
    feeds the last verified token plus its k drafted tokens on top of the cache (the first round
    feeds the whole prompt plus k), so where each round starts tells how many tokens the previous
    one emitted: all it accepted plus the target's own token."""
    starts, drafted = [], []
    for new, cached in calls:
        starts.append(cached + 1 - prompt_length if cached else 0)  # tokens generated before this round
        drafted.append(new - 1 if cached else new - prompt_length)
    ends = starts[1:] + [generated]
    accepted = [min(k, max(0, end - start - 1)) for k, start, end in zip(drafted, starts, ends)]
    return accepted, drafted


# -- the measurement loop -----------------------------------------------------------------------
def warm_up(methods: list[Method], prompt: Prompt, tokens: int, seed: int) -> None:
    """Run each method once, untimed, so that first-call costs (allocation, lazy initialisation)
    stay out of the measurement."""
    if tokens > 0:
        short = Prompt(prompt.id, prompt.text, prompt.ids, min(tokens, prompt.max_new_tokens))
        for method in methods:
            method.generate(short, seed)


def run_evaluation(methods: list[Method], prompts: list[Prompt], args: EvaluationArguments,
                   probe: metrics.CostProbe, tokenizer=None,
                   on_prompt: Callable[[list[dict]], None] | None = None, label: str = "evaluate") -> list[dict]:
    """Every method on every prompt, interleaved per prompt with the starting method rotating,
    timed one generation at a time, then `--cost_steps_per_prompt` draft steps and target
    verifications of the `probe`, whose medians go into the prompt's records. Returns one record per
    (prompt, method), with the output decoded when a `tokenizer` is given; `on_prompt(records)` is
    called after each prompt with the records so far (to save partial results); `label` names
    the progress bar."""
    records: list[dict] = []
    for n, prompt in enumerate(tqdm(prompts, desc=label, unit="prompt", disable=not args.progress)):
        seed = args.random_seed + prompt.id
        order = methods[n % len(methods):] + methods[:n % len(methods)]
        runs = {}
        for method in order:
            start = time.perf_counter()
            counts = method.generate(prompt, seed)
            runs[method.spec.name] = (counts, time.perf_counter() - start)
        timing = _time_cost_steps(probe, args.cost_steps_per_prompt)
        records += [{**_record(prompt, method.spec, runs, args, tokenizer), **timing} for method in methods]
        if on_prompt is not None:
            on_prompt(records)
    return records


def _time_cost_steps(probe: metrics.CostProbe, steps: int) -> dict:
    """The medians of `steps` timed draft steps and target verifications, in ms."""
    draft_ms, target_ms = probe.sample(steps)
    return {"draft_step_ms": statistics.median(draft_ms), "target_verify_ms": statistics.median(target_ms)}


def _record(prompt: Prompt, spec: MethodSpec, runs: dict, args: EvaluationArguments, tokenizer) -> dict:
    """The reference's per-prompt fields for one method (`spec_time`, `target_time`, `draft_time`,
    `num_mismatched_tokens` = discarded draft tokens, `num_LM_call` = target forward passes,
    `generated_length`, ...) plus ours."""
    counts, seconds = runs[spec.name]
    target, target_time = runs["target"]
    draft, draft_time = runs.get("draft", (None, None))
    checked = spec.engine is not None and not args.do_sample
    return {
        "id": prompt.id, "method": spec.name, "engine": spec.engine, "schedule": spec.schedule,
        "num_assistant_tokens": spec.num_assistant_tokens, "stop_threshold": spec.stop_threshold,
        "head": spec.head, "assistant_confidence_threshold": spec.assistant_confidence_threshold,
        "prompt": prompt.text, "prefix": prompt.ids,
        "spec_time": seconds, "target_time": target_time, "draft_time": draft_time,
        "num_mismatched_tokens": counts.discarded_tokens, "num_LM_call": counts.target_calls,
        "generated_length": len(counts.tokens), "generated_length_target": len(target.tokens),
        "generated_length_draft": len(draft.tokens) if draft is not None else None,
        "draft_calls": counts.draft_calls, "accepted_lengths": counts.accepted_lengths,
        "speedup": target_time / seconds, "tokens": counts.tokens,
        "output": tokenizer.decode(counts.tokens) if tokenizer is not None else None,
        "matches_target": counts.tokens == target.tokens if checked else None,
    }


# -- reporting ----------------------------------------------------------------------------------
def results_file(save_path: str | Path, prompts: list[Prompt]) -> Path:
    """The reference's file name, `results_{n_begin}to{n_end}.json`, for these prompts."""
    return Path(save_path) / f"results_{prompts[0].id}to{prompts[-1].id + 1}.json"


def write_json(path: Path, data, indent: int | None = None) -> None:
    path.write_text(json.dumps(data, indent=indent) + "\n", encoding="utf-8")


def report(records: list[dict], cost: dict, args: EvaluationArguments, title: str = "", **extra) -> dict:
    """Summarize `records`, print the table and the greedy verdict, save `summary.json` (with
    `extra` entries) and the figures in `--save_path`. Returns the summary document."""
    summary = metrics.summarize(records, cost["cost_ratio"])
    table = metrics.format_table(summary, cost["cost_ratio"])
    verdict = metrics.greedy_verdict(summary)
    save_path = Path(args.save_path)
    document = {"title": title, "prompts": len({r["id"] for r in records}), "summary": summary, "table": table,
                "greedy_check": verdict, "cost": cost, **extra, "settings": asdict(args), "machine": machine_info()}
    if args.plots:
        document["figures"] = [str(plots.plot_pareto(summary, save_path / "pareto.png", title)),
                               str(plots.plot_speedup(summary, save_path / "speedup_vs_threshold.png", title))]
    write_json(save_path / "summary.json", document, indent=1)
    print(table)
    if verdict:
        print(verdict)
    return document


def machine_info() -> dict:
    """Where the timings were taken (they only compare within one run)."""
    return {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


# -- the whole evaluation -----------------------------------------------------------------------
def load_inputs(args: EvaluationArguments, model_args: ModelLoadingArguments) -> tuple[object, list[Prompt]]:
    """Check the settings, load the tokenizer and read the prompts: everything that can fail on bad
    input before a model is loaded. Returns the tokenizer and the prompts."""
    check_arguments(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args.model_name, trust_remote_code=model_args.trust_remote_code)
    prompts = load_eval_prompts(args, tokenizer)
    torch.manual_seed(args.random_seed)
    return tokenizer, prompts


def measure(pair: Pair, specs: list[MethodSpec], prompts: list[Prompt], args: EvaluationArguments,
            results_path: Path | None = None, label: str = "evaluate",
            done: list[dict] | None = None) -> tuple[list[dict], dict]:
    """Warm the methods up, then run every method on every prompt not already in `done` (records
    of an interrupted run), timing the cost ratio's steps after each prompt and saving all
    records so far to `results_path`. Returns the records (`done` first) and the run's cost
    measurement (`run_cost`)."""
    done = done or []
    methods = [build_method(spec, pair, args) for spec in specs]
    warm_up(methods, prompts[0], args.warmup_tokens, args.random_seed)
    probe = metrics.CostProbe(pair.target, pair.draft, torch.tensor([prompts[0].ids]))
    finished = {record["id"] for record in done}
    todo = [prompt for prompt in prompts if prompt.id not in finished]
    save = (lambda so_far: write_json(results_path, done + so_far)) if results_path is not None else None
    records = done + run_evaluation(methods, todo, args, probe, pair.tokenizer, on_prompt=save, label=label)
    return records, run_cost(records, probe, args.cost_steps_per_prompt)


def run_cost(records: list[dict], probe: metrics.CostProbe, steps_per_prompt: int) -> dict:
    """The run's cost ratio c: the median over prompts of the draft step and of the target
    verification timed after each prompt (`metrics.cost_ratio`), with `steps_per_prompt` and the
    number of `prompts` timed. Records saved by a version that timed c only once carry no
    timings; if none does, the probe times as many steps now."""
    timed = {r["id"]: (r["draft_step_ms"], r["target_verify_ms"]) for r in records if "draft_step_ms" in r}
    if timed:
        draft_ms, target_ms = (list(times) for times in zip(*timed.values()))
    else:
        draft_ms, target_ms = probe.sample(steps_per_prompt * len({r["id"] for r in records}))
    return {**metrics.cost_ratio(draft_ms, target_ms, probe.k), "steps_per_prompt": steps_per_prompt,
            "prompts": len(timed)}


def finished_records(path: Path, specs: list[MethodSpec], prompts: list[Prompt]) -> list[dict]:
    """The records of an interrupted run saved at `path` (none if there is no file), after checking
    that they come from the same methods and prompts; a prompt is saved only once all its methods
    have run, so every prompt found is complete."""
    if not path.is_file():
        return []
    records = json.loads(path.read_text(encoding="utf-8"))
    names = sorted(spec.name for spec in specs)
    by_id = {prompt.id: prompt for prompt in prompts}
    saved_by_id: dict[int, list[dict]] = {}
    for record in records:
        saved_by_id.setdefault(record["id"], []).append(record)
    for prompt_id, saved in saved_by_id.items():
        if sorted(record["method"] for record in saved) != names:
            raise ValueError(f"{path} holds other methods than this run ({', '.join(names)}); "
                             "rerun with the same flags, or choose another --save_path to start afresh")
        if prompt_id not in by_id or saved[0]["prefix"] != by_id[prompt_id].ids:
            raise ValueError(f"{path} holds other prompts than this run (prompt {prompt_id} differs); "
                             "rerun with the same flags, or choose another --save_path to start afresh")
    return records


def run_title(args: EvaluationArguments, prompts: list[Prompt]) -> str:
    """What a run measured, in a few words: `humaneval prompts 0-163, greedy, 128 new tokens`."""
    decoding = f"sampled (temperature {args.temperature:g})" if args.do_sample else "greedy"
    return f"{args.data_path} prompts {prompts[0].id}-{prompts[-1].id}, {decoding}, {args.max_new_tokens} new tokens"


def evaluate(args: EvaluationArguments, model_args: ModelLoadingArguments | None = None, title: str = "") -> dict:
    """The whole evaluation the flags describe: `load_inputs`, the saved records when resuming,
    `load_pair`, `measure`, `report` (under `title`, by default `run_title`). Returns the summary
    document, with `records_file` the path of the per-prompt records."""
    model_args = model_args or ModelLoadingArguments()
    tokenizer, prompts = load_inputs(args, model_args)
    specs = method_specs(args)
    need_head = any(spec.schedule == "ada" for spec in specs)
    path = results_file(args.save_path, prompts)
    done = finished_records(path, specs, prompts) if args.resume else []
    pair = load_pair(args, model_args, tokenizer, need_head)
    records, cost = measure(pair, specs, prompts, args, results_path=path, done=done)
    return report(records, cost, args, title or run_title(args, prompts), records_file=str(path))


def parse_args(argv: list[str] | None = None) -> tuple[EvaluationArguments, ModelLoadingArguments]:
    parser = HfArgumentParser((EvaluationArguments, ModelLoadingArguments),
                              description="Evaluate candidate-length schedules against baselines.")
    args, model_args = parser.parse_args_into_dataclasses(args=argv)
    return args, model_args


def main(argv: list[str] | None = None) -> None:
    """`specdecpp evaluate [flags]`: run `evaluate` and exit non-zero with a one-line message on bad input."""
    args, model_args = parse_args(argv)
    try:
        document = evaluate(args, model_args)
    except (ValueError, FileNotFoundError) as error:
        sys.exit(f"specdecpp evaluate: error: {error}")
    print(f"records: {document['records_file']}\nsummary: {Path(args.save_path) / 'summary.json'}")


if __name__ == "__main__":
    main()
