"""The methods an evaluation compares and the adapter to our engine."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from transformers import PreTrainedModel

from specdecpp.engine.decoding import decode
from specdecpp.engine.schedules import SCHEDULES
from specdecpp.engine.settings import DecodingSettings, default
from specdecpp.evaluation.arguments import MethodGrid, Prompt, budget_step_times_from, may_store_threshold
from specdecpp.head.folder import stored_step_times
from specdecpp.head.model import AcceptancePredictionHead


@dataclass
class MethodSpec:
    """What a method is: `target`, `draft`, `specdecpp:<schedule>[@...]` or `hf:<schedule>[@...]`."""

    name: str
    engine: str | None  # "specdecpp" or "hf"; None for a model alone
    schedule: str
    num_assistant_tokens: int | None = None
    stop_threshold: float | str | None = None  # "auto" until the head is loaded
    head: str | None = None  # the ada head's folder or Hub id
    assistant_confidence_threshold: float | None = None
    online: bool = False  # ada with online recalibration
    step_times_from: str | None = None  # verify-budget, ada-budget, auto trees: where their step times are stored
    tree_nodes: int | str | None = None  # ada-tree, confidence-tree


@dataclass
class Counts:
    """What one generation produced and cost, in forward passes (None where unknown)."""

    tokens: list[int]
    target_calls: int | None
    draft_calls: int | None
    discarded_tokens: int | None
    accepted_lengths: list[int] | None
    compile_time: float = 0.0  # seconds spent compiling, inside its time


@dataclass
class Method:
    """A runnable method: its spec and its `generate(prompt, seed)`."""

    spec: MethodSpec
    generate: Callable[[Prompt, int], Counts]
    restart: Callable[[], None] = lambda: None  # forget what it learned (after the warm-up)


def method_specs(grid: MethodGrid, heads: list[str]) -> list[MethodSpec]:
    """The grid's methods, ada's with each of `heads`: baselines first, then one per schedule and knob."""
    specs = [MethodSpec("target", None, "none")]
    if "draft" in grid.baselines:
        specs.append(MethodSpec("draft", None, "none"))
    for schedule in ("constant", "heuristic", "dynamic"):
        if f"hf:{schedule}" in grid.baselines:
            specs += _knob_specs("hf", schedule, grid, heads)
    for schedule in dict.fromkeys(grid.schedule):
        if schedule != "none":
            specs += _knob_specs("specdecpp", schedule, grid, heads)
    return specs


def _knob_specs(engine: str, schedule: str, grid: MethodGrid, heads: list[str]) -> list[MethodSpec]:
    if schedule == "constant":
        return [MethodSpec(f"{engine}:constant@K={k}", engine, schedule, num_assistant_tokens=k)
                for k in dict.fromkeys(grid.num_assistant_tokens)]
    if schedule == "heuristic":  # it adapts K itself: one starting point is enough
        k = grid.num_assistant_tokens[0]
        return [MethodSpec(f"{engine}:heuristic@K={k}", engine, schedule, num_assistant_tokens=k)]
    if schedule == "ada":
        heads = list(dict.fromkeys(heads))
        return [MethodSpec(f"{engine}:ada" + ("-online" if online else "")
                           + (f"[{head_label(head)}]" if len(heads) > 1 else "")
                           + f"@{t if t == 'auto' else format(float(t), 'g')}", engine, schedule,
                           stop_threshold=t if t == "auto" else float(t), head=head, online=online)
                for online in (False, True)[:1 + grid.online] for head in heads
                for t in dict.fromkeys(grid.stop_threshold or [head_default_threshold(head)])
                if t != "auto" or may_store_threshold(head)]
    if SCHEDULES[schedule].grows_tree:  # per tree size, threshold and (ada-tree) head
        tree_heads = list(dict.fromkeys(heads)) if SCHEDULES[schedule].needs_head else [None]
        thresholds = [t for t in dict.fromkeys(grid.stop_threshold or [
            head_default_threshold(tree_heads[0]) if tree_heads[0] else str(default("stop_threshold"))])
                      if t != "auto" or SCHEDULES[schedule].needs_head]
        return [MethodSpec(f"{engine}:{schedule}" + (f"[{head_label(head)}]" if len(tree_heads) > 1 else "")
                           + f"@{t if t == 'auto' else format(float(t), 'g')},nodes={n}", engine, schedule,
                           stop_threshold=t if t == "auto" else float(t), head=head,
                           tree_nodes=int(n) if n.isdigit() else n,
                           step_times_from=budget_step_times_from(grid, schedule, heads) if n == "auto" else None)
                for head in tree_heads for t in thresholds for n in dict.fromkeys(grid.tree_nodes)
                if head is None or t != "auto" or may_store_threshold(head)]
    if schedule == "online":
        return [MethodSpec(f"{engine}:online@{t:g}", engine, schedule, stop_threshold=t)
                for t in dict.fromkeys(grid.online_threshold)]
    if SCHEDULES[schedule].needs_step_times:  # one per block K, and per head for one that reads a head
        block_heads = list(dict.fromkeys(heads)) if SCHEDULES[schedule].needs_head else [None]
        return [MethodSpec(f"{engine}:{schedule}" + (f"[{head_label(head)}]" if len(block_heads) > 1 else "")
                           + f"@K={k}", engine, schedule, num_assistant_tokens=k, head=head,
                           step_times_from=budget_step_times_from(grid, schedule, heads))
                for head in block_heads for k in dict.fromkeys(grid.num_assistant_tokens)]
    if schedule == "dynamic":
        confidences = list(dict.fromkeys(grid.assistant_confidence_threshold))
        if engine == "hf":  # it moves its threshold itself: one starting point is enough
            confidences = confidences[:1]
        return [MethodSpec(f"{engine}:dynamic" + (f"@{c:g}" if len(confidences) > 1 else ""), engine, schedule,
                           num_assistant_tokens=grid.dynamic_num_assistant_tokens, assistant_confidence_threshold=c)
                for c in confidences]
    return [MethodSpec(f"{engine}:{schedule}", engine, schedule)]


def head_default_threshold(head_dir: str) -> str:
    """What `--stop_threshold` left out means for `head_dir`: "auto" where it may store one, else the default."""
    return "auto" if may_store_threshold(head_dir) else str(default("stop_threshold"))


def head_label(head_dir: str) -> str:
    """A head's short name in method names: its folder's (or Hub repo's) last part."""
    return Path(head_dir.rstrip("/")).name


def generation_kwargs(decoding: DecodingSettings) -> dict:
    """`generate`'s keyword arguments decoding as `decoding` does (sampling and processing)."""
    sampling = dict(do_sample=True, temperature=decoding.temperature, top_k=decoding.top_k, top_p=decoding.top_p) \
        if decoding.do_sample else dict(do_sample=False)
    return sampling | decoding.processing_fields()


def method_settings(spec: MethodSpec, head: AcceptancePredictionHead | None,
                    decoding: DecodingSettings) -> DecodingSettings:
    """The engine's settings for `spec`: `decoding` with the spec's schedule, knobs, head and step times."""
    knobs = {k: v for k, v in (("num_assistant_tokens", spec.num_assistant_tokens),
                               ("stop_threshold", spec.stop_threshold),
                               ("assistant_confidence_threshold", spec.assistant_confidence_threshold),
                               ("tree_nodes", spec.tree_nodes)) if v is not None}
    if spec.step_times_from is not None:
        plain, judged = stored_step_times(spec.step_times_from)
        knobs["step_times"] = judged if SCHEDULES[spec.schedule].needs_head else plain
    return replace(decoding, schedule=spec.schedule, head=head, online=spec.online, **knobs).with_head_defaults()


def engine_generate(spec: MethodSpec, target: PreTrainedModel, draft: PreTrainedModel | None,
                    head: AcceptancePredictionHead | None,
                    decoding: DecodingSettings) -> tuple[Callable[[Prompt, int], Counts], Callable[[], None]]:
    """Our engine with `spec`'s schedule: `(generate, restart)`, `restart` resetting a learning method's estimator."""
    settings = method_settings(spec, head, decoding)
    alone_is_draft = spec.engine is None and spec.name == "draft"

    def restart() -> None:
        settings.estimator = settings.schedule_class.new_estimator(settings)

    def generate(prompt: Prompt, seed: int) -> Counts:
        device = target.get_input_embeddings().weight.device
        generator = torch.Generator(device).manual_seed(seed)
        out = decode(target, draft, torch.tensor([prompt.ids], device=device),
                     replace(settings, max_new_tokens=prompt.max_new_tokens), generator=generator)
        stats, tokens = out.stats, out.sequences[0, len(prompt.ids):].tolist()
        if spec.engine is None:
            calls = (0, stats.target_calls) if alone_is_draft else (stats.target_calls, 0)
            return Counts(tokens, *calls, discarded_tokens=0, accepted_lengths=None, compile_time=stats.compile_time)
        return Counts(tokens, stats.target_calls, stats.draft_calls, stats.discarded_tokens,
                      list(stats.accepted_lengths), stats.compile_time)

    restart()
    return generate, restart
