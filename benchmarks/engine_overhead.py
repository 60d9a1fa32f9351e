"""How much time does the decode loop add on top of the models' own forward passes?

Two measurements, methods interleaved per prompt, warm-up excluded, medians:
1. target alone through the engine (`schedule="none"`) against `target.generate(do_sample=False)`
   on the same prompts: the ratio of their times (goal: under 1.05);
2. per speculative round (`constant` K), the time outside the models' forward passes — Python
   bookkeeping, verification, cache cropping — as a share of the round.

    python benchmarks/engine_overhead.py                       # the zoo pair in checkpoints/zoo
    python benchmarks/engine_overhead.py --random              # random Llama models of the zoo's shape
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from harness import DRAFT, TARGET, load_pair
from transformers import LlamaConfig, LlamaForCausalLM

from specdecpp import speculative_generate


class ForwardTimer:
    """Accumulates wall time spent inside a model's forward (pre-hook to hook)."""

    def __init__(self, *models: torch.nn.Module):
        self.total = 0.0
        for model in models:
            model.register_forward_pre_hook(self._start)
            model.register_forward_hook(self._stop)

    def _start(self, module, args):
        self._began = time.perf_counter()

    def _stop(self, module, args, output):
        self.total += time.perf_counter() - self._began


def random_llama(num_layers: int, hidden_size: int, vocab_size: int, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=4 * hidden_size,
                         num_hidden_layers=num_layers, num_attention_heads=hidden_size // 64,
                         max_position_embeddings=2048, initializer_range=0.2)
    return LlamaForCausalLM(config).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=TARGET)
    parser.add_argument("--draft", default=DRAFT)
    parser.add_argument("--random", action="store_true", help="random 8x256 target / 1x256 draft instead of the zoo")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--prompt_length", type=int, default=64)
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    if args.random:
        target, draft = random_llama(8, 256, 4096, seed=0), random_llama(1, 256, 4096, seed=1)
    else:
        target, draft, _ = load_pair(args.target, args.draft)
    vocab = target.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, vocab, (1, args.prompt_length), generator=generator) for _ in range(args.prompts + 1)]
    timer = ForwardTimer(target, draft)

    engine_times, generate_times, overhead_shares, round_overheads_ms = [], [], [], []
    for i, prompt in enumerate(prompts):
        # No EOS: every method generates exactly max_new_tokens tokens.
        start = time.perf_counter()
        expected = target.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                   max_new_tokens=args.max_new_tokens, min_new_tokens=args.max_new_tokens,
                                   eos_token_id=None, pad_token_id=0)
        generate_time = time.perf_counter() - start
        engine = speculative_generate(target, None, prompt, schedule="none", max_new_tokens=args.max_new_tokens,
                                      eos_token_id=[])
        assert torch.equal(engine.sequences, expected), "engine and generate disagree"
        timer.total = 0.0
        spec = speculative_generate(target, draft, prompt, schedule="constant", num_assistant_tokens=args.k,
                                    max_new_tokens=args.max_new_tokens, eos_token_id=[])
        if i == 0:  # warm-up
            continue
        generate_times.append(generate_time)
        engine_times.append(engine.stats.wall_time)
        overhead = spec.stats.wall_time - timer.total
        overhead_shares.append(overhead / spec.stats.wall_time)
        round_overheads_ms.append(1000 * overhead / spec.stats.target_calls)

    median = statistics.median
    print(f"threads {torch.get_num_threads()}, {args.prompts} prompts of {args.prompt_length} tokens, "
          f"{args.max_new_tokens} new tokens, target {target.config.num_hidden_layers}x{target.config.hidden_size}, "
          f"draft {draft.config.num_hidden_layers}x{draft.config.hidden_size}, vocab {vocab}")
    print(f"target alone, target.generate : {1000 * median(generate_times) / args.max_new_tokens:7.2f} ms/token")
    print(f"target alone, specdecpp engine: {1000 * median(engine_times) / args.max_new_tokens:7.2f} ms/token")
    print(f"engine / generate time ratio  : {median(e / g for e, g in zip(engine_times, generate_times)):7.3f}")
    print(f"constant K={args.k}: time outside model forwards {100 * median(overhead_shares):.1f}% of the round, "
          f"{median(round_overheads_ms):.2f} ms per round")


if __name__ == "__main__":
    main()
