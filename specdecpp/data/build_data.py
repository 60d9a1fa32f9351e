"""Build the acceptance head's training records from a target/draft pair, `python -m specdecpp.data.build_data
--target T --draft D --prompts SRC --output OUT.jsonl [flags]` (under torchrun, each rank its share). Resumable:
shards go to `OUT.parts/` and are merged into `OUT` once every prompt is done."""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from datetime import timedelta
from glob import glob

import torch
import torch.distributed as dist
from tqdm import tqdm
from transformers import GenerationConfig, HfArgumentParser, LogitsProcessor, LogitsProcessorList, PreTrainedModel

from specdecpp import checks
from specdecpp.checks import trim_at_eos
from specdecpp.cli import common_field, input_errors, option
from specdecpp.data.io import atomic_write, read_complete_lines, to_json_line, write_records
from specdecpp.data.prompts import FORMATS, load_prompts, tokenize_prompt
from specdecpp.engine.processing import NEUTRAL, Processing, build_processing
from specdecpp.engine.sampling import make_warpers, residual_distribution, sample
from specdecpp.engine.settings import DecodingSettings
from specdecpp.models import (PairArguments, check_tokenizer, load_model, load_tokenizer, model_device,
                              positions_from_mask)


@dataclass
class BuildDataArguments:
    """What to build, next to the pair (`PairArguments`)."""

    prompts: str = common_field("prompts", help="a registered set (humaneval), a .json/.jsonl file, or a Hub dataset")
    output: str = common_field("output", help="where the records go (JSON Lines)")
    max_new_tokens: int = option(128, "length of each target continuation")
    do_sample: bool = option(False, "sample (else greedy): continuations and draft proposals")
    temperature: float = option(1.0, "sampling temperature (both models)")
    top_k: int = option(0, "top-k filtering when sampling (0: off)")
    top_p: float = option(1.0, "nucleus filtering when sampling (1: off)")
    repetition_penalty: float = option(1.0, "generate's repetition penalty on both models' logits (1: off)")
    num_candidates: int = option(4, "the draft's candidates kept per position, the proposal first, each with its "
        "acceptance quantity (`candidates`, `candidate_p_acc`; 0: none)")
    batch_size: int = option(8, "prompts per batch on each rank")
    seed: int = common_field("seed", default=0, help="seed of the sampling draws (each batch is seeded from it)")
    n_begin: int = option(0, "first prompt of the source to use")
    n_end: int | None = option(None, "one past the last prompt to use (default: all)")
    prompts_split: str | None = common_field("prompts_split", default=None, help="split of a Hub dataset")
    prompt_format: str = option("auto", f"one of {', '.join(FORMATS)}")
    tokenizer_name: str | None = option(None, "tokenizer (default: the target's)")
    overwrite: bool = option(False, "rebuild even if the output (or a partial build) exists")

    def __post_init__(self):
        if self.max_new_tokens <= 0 or self.batch_size <= 0:
            raise ValueError(f"max_new_tokens and batch_size must be > 0, got {self.max_new_tokens}, {self.batch_size}")
        if self.num_candidates < 0:
            raise ValueError(f"--num_candidates must be >= 0, got {self.num_candidates}")
        if self.prompt_format not in FORMATS:
            raise ValueError(f"unknown prompt_format {self.prompt_format!r}; choose from {', '.join(FORMATS)}")
        make_warpers(self.temperature, self.top_k, self.top_p)  # raises on bad sampling settings
        if not self.repetition_penalty > 0:
            raise ValueError(f"--repetition_penalty must be > 0, got {self.repetition_penalty}")
        if not self.output.endswith(".jsonl"):
            raise ValueError(f"--output must end in .jsonl (records are JSON Lines), got {self.output}")

    def processing_fields(self) -> dict:
        """The logits processing the records are built under, as `DecodingSettings.processing_fields()`."""
        return DecodingSettings(repetition_penalty=self.repetition_penalty).processing_fields()


def left_pad(prefixes: list[list[int]], pad_token_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """`(input_ids, attention_mask)` with every prefix right-aligned, as generation needs."""
    width = max(len(p) for p in prefixes)
    input_ids = torch.full((len(prefixes), width), pad_token_id, dtype=torch.long, device=device)
    attention_mask = torch.zeros_like(input_ids)
    for row, prefix in enumerate(prefixes):
        input_ids[row, width - len(prefix):] = torch.tensor(prefix, device=device)
        attention_mask[row, width - len(prefix):] = 1
    return input_ids, attention_mask


def continuation_logits(model: PreTrainedModel, sequences: torch.Tensor, attention_mask: torch.Tensor,
                        n: int) -> torch.Tensor:
    """Teacher-forced logits `[batch, n, vocab]` predicting the last `n` tokens of left-padded `sequences`."""
    device = model_device(model)
    sequences, attention_mask = sequences.to(device), attention_mask.to(device)
    return model(input_ids=sequences, attention_mask=attention_mask, position_ids=positions_from_mask(attention_mask),
                 logits_to_keep=n + 1, use_cache=False).logits[:, :-1]


class RowProcessing(LogitsProcessor):
    """Each row of a left-padded batch processed by its own `Processing`, without the padding."""

    def __init__(self, processings: list[Processing], pads: list[int]):
        self.processings, self.pads = processings, pads

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        return torch.cat([processing.processors(input_ids[row:row + 1, pad:], scores[row:row + 1])
                          for row, (processing, pad) in enumerate(zip(self.processings, self.pads))])


def processed_logits(processings: list[Processing], contexts: list[list[int]], logits: torch.Tensor,
                     lengths: list[int]) -> torch.Tensor:
    """The continuation logits `[sum(lengths), vocab]`, each row processed after its prefix in `contexts`."""
    return torch.cat([p.logits(ctx, rows) for p, ctx, rows in zip(processings, contexts, logits.split(lengths))])


@torch.no_grad()
def build_batch(target: PreTrainedModel, draft: PreTrainedModel, prefixes: list[list[int]], *, max_new_tokens: int,
                do_sample: bool = False, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                processing_fields: dict | None = None, pad_token_id: int = 0,
                eos_token_ids: set[int] | frozenset = frozenset(), seed: int = 0,
                num_candidates: int = BuildDataArguments.num_candidates) -> list[dict]:
    """Records for a batch of tokenized prompts: the target's continuation, scored by one teacher-forced forward of
    each model, logits processed as decoding does. `p_acc` is `min(1, p/q)` when sampling (draws from `seed`), else
    1.0 where the draft's argmax is the target's; `num_candidates` > 0 adds `draft_candidates`."""
    if any(len(p) == 0 for p in prefixes):
        raise ValueError("every prompt needs at least one token")
    processing_fields = processing_fields or {}
    input_ids, attention_mask = left_pad(prefixes, pad_token_id, model_device(target))
    settings = DecodingSettings(max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature,
                                top_k=top_k, top_p=top_p, **processing_fields)
    processings = [build_processing(target, settings.generation_config(len(prefix), set(eos_token_ids)),
                                    torch.tensor([prefix], device=input_ids.device)) for prefix in prefixes]
    # generate's own processing is neutral (RowProcessing applies it), none taken from the checkpoint's config.
    neutral = {name: value for name, value in NEUTRAL.items()
               if name != "min_new_tokens" or getattr(target.generation_config, name, None) is not None}
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=do_sample, pad_token_id=pad_token_id,
                              eos_token_id=sorted(eos_token_ids) or None, temperature=1.0, top_k=0, top_p=1.0,
                              **neutral)
    pads = [input_ids.shape[1] - len(prefix) for prefix in prefixes]
    torch.manual_seed(seed)  # generate() samples from the global generator
    sequences = target.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config,
                                logits_processor=LogitsProcessorList([RowProcessing(processings, pads)]))
    width = input_ids.shape[1]
    continuations = [trim_at_eos(row.tolist(), set(eos_token_ids)) for row in sequences[:, width:]]
    n = sequences.shape[1] - width
    lengths = [len(c) for c in continuations]
    valid = torch.arange(n, device=sequences.device)[None, :] < torch.tensor(lengths, device=sequences.device)[:, None]
    mask = torch.cat([attention_mask, valid.long()], dim=1)
    draft_logits = continuation_logits(draft, sequences, mask, n)[valid.to(model_device(draft))]
    target_logits = continuation_logits(target, sequences, mask, n)[valid.to(model_device(target))]
    contexts = [prefix + tokens[:-1] for prefix, tokens in zip(prefixes, continuations)]
    q_logits = processed_logits(processings, contexts, draft_logits, lengths)
    p_logits = processed_logits(processings, contexts, target_logits.to(draft_logits.device), lengths)
    log_q, log_p = q_logits.log_softmax(-1), p_logits.log_softmax(-1)
    generator = torch.Generator(q_logits.device).manual_seed(seed) if do_sample else None
    proposals = sample(q_logits.softmax(-1), generator) if do_sample else q_logits.argmax(-1)
    log_q_tok, log_p_tok = (lp.gather(-1, proposals[:, None])[:, 0] for lp in (log_q, log_p))
    target_choice = p_logits.argmax(-1)
    p_acc = (log_p_tok - log_q_tok).exp().clamp(max=1.0) if do_sample else (proposals == target_choice).to(log_p.dtype)
    target_entropy = -(log_p.exp() * log_p.clamp_min(-1e4)).sum(-1)
    kept = draft_candidates(log_q, log_p, proposals, num_candidates, generator, target_choice) \
        if num_candidates else None
    records, start = [], 0
    for tokens in continuations:
        end = start + len(tokens)
        record = {"tokens": tokens, "draft": proposals[start:end].tolist(),
                  "log_p_draft": log_q_tok[start:end].tolist(), "log_p_target": log_p_tok[start:end].tolist(),
                  "p_acc": p_acc[start:end].tolist(), "target_entropy": target_entropy[start:end].tolist()}
        if kept:
            record["candidates"], record["candidate_p_acc"] = kept[0][start:end], kept[1][start:end]
        records.append(record | {"processing": processing_fields})
        start = end
    return records


def draft_candidates(log_q: torch.Tensor, log_p: torch.Tensor, proposals: torch.Tensor, num_candidates: int,
                     generator: torch.Generator | None,
                     target_choice: torch.Tensor) -> tuple[list[list[int]], list[list[float]]]:
    """Per position, the draft's first `num_candidates` tokens with mass under its processed `log_q`, the proposal
    first, and each one's acceptance quantity (docs/design.md, The record format): greedy (`generator` None), in
    `log_q`'s order, 1.0 for `target_choice`; sampled, in the exponential race's order, by recursive rejection."""
    keys = log_q.double()
    if generator is not None:
        keys = keys - torch.empty_like(keys).exponential_(generator=generator).log()
    keys = keys.scatter(-1, proposals[:, None], float("inf"))
    candidates = keys.topk(min(num_candidates, keys.shape[-1]), dim=-1).indices
    labels = (candidates == target_choice[:, None]).to(log_p.dtype) if generator is None \
        else recursive_rejection_acceptance(log_q, log_p, candidates)
    kept = (log_q.gather(-1, candidates) > float("-inf")).sum(-1).tolist()  # how many candidates have mass
    return [row[:n] for row, n in zip(candidates.tolist(), kept)], [row[:n] for row, n in zip(labels.tolist(), kept)]


def recursive_rejection_acceptance(log_q: torch.Tensor, log_p: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """`[positions, len(candidates)]`: the probability that recursive rejection sampling accepts each candidate
    once the ones before it were rejected (`draft_candidates`); the first is `min(1, p/q)` of the proposal."""
    columns, log_r, log_q_i = [], log_p, log_q
    for i in range(candidates.shape[-1]):
        x = candidates[:, i:i + 1]
        columns.append((log_r.gather(-1, x) - log_q_i.gather(-1, x)).exp().clamp(max=1.0)[:, 0].double())
        r, q_i = log_r.double().exp(), log_q_i.double().exp()
        log_r = residual_distribution(r, q_i).log()
        q_i = q_i.scatter(-1, x, 0.0)
        log_q_i = (q_i / q_i.sum(-1, keepdim=True)).log()
    return torch.stack(columns, -1).nan_to_num(0.0)


def init_distributed() -> tuple[int, int]:
    """`(rank, world_size)` of the process group torchrun set up; `(0, 1)` in a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        # a long build leaves fast ranks waiting at the final barrier: allow for it
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", timeout=timedelta(hours=24))
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


# The names a partial build's meta.json records these settings under.
SETTING_NAMES = {"prompts": "dataset", "prompts_split": "dataset_split"}


def run_settings(args: BuildDataArguments, pair: PairArguments) -> dict:
    """What decides the records' content; a partial build made with other settings is not resumed."""
    settings = {"target_name": pair.target, "draft_name": pair.draft}
    settings |= {SETTING_NAMES.get(name, name): value for name, value in asdict(args).items()
                 if name not in ("output", "batch_size", "overwrite", "repetition_penalty", "num_candidates")}
    # the candidates only when kept, so that a build started before they existed resumes without them
    settings |= {"num_candidates": args.num_candidates} if args.num_candidates else {}
    # the processing by its set fields only, so that a build started before they existed still resumes
    return settings | args.processing_fields() | {"torch_dtype": pair.torch_dtype}


def check_settings(parts_dir: str, settings: dict) -> None:
    """Refuse to resume a partial build made with different settings (nothing to check for a new one)."""
    path = os.path.join(parts_dir, "meta.json")
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                saved = json.load(f)
        except ValueError as error:
            raise ValueError(f"{path} is damaged ({error}): pass --overwrite to start the build again") from None
        # both ways: a setting recorded only when set (the processing) may be absent from either
        if changed := {k: (saved.get(k), settings.get(k)) for k in saved | settings if saved.get(k) != settings.get(k)}:
            raise ValueError(f"{parts_dir} holds a partial build made with other settings "
                             f"({', '.join(f'{k}: {a!r} -> {b!r}' for k, (a, b) in changed.items())}); "
                             "rerun with the same settings to resume it, or pass --overwrite to start again")


def write_settings(parts_dir: str, settings: dict, rank: int) -> None:
    """Record the settings of a new partial build (rank 0); a resumed one keeps its own."""
    path = os.path.join(parts_dir, "meta.json")
    if rank == 0 and not os.path.exists(path):
        os.makedirs(parts_dir, exist_ok=True)
        with atomic_write(path) as f:
            json.dump(settings, f, indent=2)


def finished_records(parts_dir: str) -> dict[int, dict]:
    """Complete records of a partial build, by prompt index."""
    done = {}
    for shard in sorted(glob(os.path.join(parts_dir, "rank*.jsonl"))):
        for record in read_complete_lines(shard)[0]:
            done.setdefault(record["index"], record)
    return done


def open_shard(parts_dir: str, rank: int):
    """This rank's shard opened for appending, a half-written last line cut off."""
    path = os.path.join(parts_dir, f"rank{rank}.jsonl")
    if os.path.exists(path):
        with open(path, "r+b") as f:
            f.truncate(read_complete_lines(path)[1])
    return open(path, "a", encoding="utf-8")


def build_data(pair: PairArguments, args: BuildDataArguments) -> dict:
    """Build (or resume) `args.output` from `pair`, each torchrun rank its share; returns this run's stats."""
    pair.require("target", "draft")
    rank, world = init_distributed()
    out, parts_dir = args.output, args.output + ".parts"
    if os.path.exists(out) and not args.overwrite:
        raise ValueError(f"{out} exists; pass --overwrite to rebuild it (or choose another --output)")
    tokenizer = load_tokenizer(args.tokenizer_name or pair.target, pair.trust_remote_code)
    texts = load_prompts(args.prompts, args.prompts_split, args.n_begin, args.n_end)
    prompts = {args.n_begin + i: tokenize_prompt(text, tokenizer, args.prompt_format) for i, text in enumerate(texts)}
    settings = run_settings(args, pair)
    if not args.overwrite:
        check_settings(parts_dir, settings)

    device = None if pair.device else (f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu")
    target, draft = (load_model(name, **pair.loading()) for name in (pair.target, pair.draft))
    if device:
        target, draft = target.to(device), draft.to(device)
    check_tokenizer(tokenizer, target, "the target")
    checks.check_same_vocab(checks.vocab_size(target), checks.vocab_size(draft))
    for model, role in ((target, "the target"), (draft, "the draft")):
        checks.check_can_roll_back(model, role)  # the records would describe a decode the engine refuses
    pad = next(t for t in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0) if t is not None)
    eos = checks.eos_ids(tokenizer.eos_token_id, checks.generation_eos(target))

    # Nothing is written before the models load and pass their checks.
    if args.overwrite and rank == 0:
        shutil.rmtree(parts_dir, ignore_errors=True)
        if os.path.exists(out):
            os.remove(out)
    barrier()
    write_settings(parts_dir, settings, rank)
    done = finished_records(parts_dir)
    barrier()  # everyone has read the same finished set before any rank appends to it
    todo = [i for i in prompts if i not in done][rank::world]

    new_tokens, start = 0, time.perf_counter()
    with open_shard(parts_dir, rank) as shard, tqdm(total=len(todo), desc=f"build-data rank {rank}/{world}",
                                                   disable=rank != 0, unit="prompt") as bar:
        for b in range(0, len(todo), args.batch_size):
            batch = todo[b: b + args.batch_size]
            records = build_batch(target, draft, [prompts[i][1] for i in batch], max_new_tokens=args.max_new_tokens,
                                  do_sample=args.do_sample, temperature=args.temperature, top_k=args.top_k,
                                  top_p=args.top_p, processing_fields=args.processing_fields(), pad_token_id=pad, eos_token_ids=eos,
                                  seed=args.seed * 1_000_003 + batch[0], num_candidates=args.num_candidates)
            for i, record in zip(batch, records):
                text = tokenizer.decode(record["tokens"], skip_special_tokens=True)
                shard.write(to_json_line({"index": i, "prompt": prompts[i][0], "prefix": prompts[i][1],
                                          "continuation": text, **record}))
                new_tokens += len(record["tokens"])
            shard.flush()
            os.fsync(shard.fileno())
            bar.update(len(batch))
    totals = torch.tensor([float(new_tokens), time.perf_counter() - start], dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(totals[:1])
        dist.all_reduce(totals[1:], op=dist.ReduceOp.MAX)
    barrier()
    if rank == 0:
        merge_shards(parts_dir, out, sorted(prompts))
    barrier()
    stats = {"records": len(prompts), "new_tokens": int(totals[0]), "seconds": float(totals[1]),
             "tokens_per_second": float(totals[0] / max(totals[1], 1e-9))}
    if rank == 0:
        print(f"wrote {stats['records']} records to {out}: {stats['new_tokens']} new tokens in "
              f"{stats['seconds']:.1f} s, {stats['tokens_per_second']:.1f} tokens/s (generation + both scoring passes)")
    return stats


def merge_shards(parts_dir: str, out: str, indices: list[int]) -> None:
    """Write the shards' records to `out` in prompt order, then drop the shards; RuntimeError for a missing one."""
    done = finished_records(parts_dir)
    if missing := [i for i in indices if i not in done]:
        raise RuntimeError(f"{len(missing)} prompts have no record (first: {missing[:5]}); rerun to complete {parts_dir}")
    write_records(out, (done[i] for i in indices))
    shutil.rmtree(parts_dir)


FLAGS = (PairArguments, BuildDataArguments)


def main(argv: list[str] | None = None) -> None:
    """Command line: `python -m specdecpp.data.build_data --help`."""
    with input_errors("build-data"):
        pair, args = HfArgumentParser(FLAGS).parse_args_into_dataclasses(args=sys.argv[1:] if argv is None else argv)
        build_data(pair, args)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
