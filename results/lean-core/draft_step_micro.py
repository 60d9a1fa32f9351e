"""One draft step, eager and compiled, without a head and judged by heads of three kinds, interleaved,
at a fixed 64-token context (one torch thread, float32), from the repository root:

    python results/lean-core/draft_step_micro.py                        # the zoo draft and its head
    python results/lean-core/draft_step_micro.py --draft smollm2-135m   # a SmolLM2-135M-shaped draft

The SmolLM2-135M-shaped draft has random weights (no download), and so do its heads; a tiny random
target of its vocabulary stands in for the target the compiled engine is built with."""
import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from specdecpp import AcceptancePredictionHead
from specdecpp.engine.compiled import compiled_models
from specdecpp.engine.draft_step import EagerDraft
from specdecpp.engine.processing import sampling_only
from specdecpp.head.model import LeanJudge

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--draft", choices=("zoo", "smollm2-135m"), default="zoo")
parser.add_argument("--repeats", type=int, default=310)
args = parser.parse_args()
torch.set_num_threads(1)
if args.draft == "zoo":
    target = AutoModelForCausalLM.from_pretrained("checkpoints/zoo/target").eval()
    draft = AutoModelForCausalLM.from_pretrained("checkpoints/zoo/draft").eval()
    full = AcceptancePredictionHead.from_pretrained("checkpoints/zoo/head")
else:
    def llama(hidden, intermediate, layers, heads, kv_heads):
        torch.manual_seed(0)
        return LlamaForCausalLM(LlamaConfig(
            vocab_size=49152, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=kv_heads, tie_word_embeddings=True)).eval()
    draft, target = llama(576, 1536, 30, 9, 3), llama(64, 128, 1, 4, 2)
    full = AcceptancePredictionHead(576, 3, alignment="proposer", features=["log_q", "entropy", "margin"])
hidden_size = draft.config.hidden_size
heads = {"no head": None, f"3 blocks, hidden + {len(full.features)} features": full,
         f"3 blocks, {len(full.features)} features only": AcceptancePredictionHead(
             0, 3, alignment="proposer", features=full.features),
         "3 blocks, hidden only": AcceptancePredictionHead(hidden_size, 3, alignment="proposer")}
for head in heads.values():  # a fresh block is the identity (zero weights): time dense ones
    if head is not None and not (head is full and args.draft == "zoo"):
        for weight, _ in head.blocks():
            torch.nn.init.normal_(weight, std=0.02)
seq, drafts = list(range(5, 69)), {}
for name, head in heads.items():
    drafts["eager", name] = EagerDraft(draft, sampling_only(False), LeanJudge(head) if head is not None else None)
    drafts["compiled", name] = compiled_models(target, draft, 256, sampling_only(False), head)[1]
times = {key: [] for key in drafts}
with torch.inference_mode():
    for repeat in range(args.repeats):
        for key, model in drafts.items():
            start = time.perf_counter()
            model.draft_step(seq, 1, None)
            if repeat >= 10:
                times[key].append(1000 * (time.perf_counter() - start))
            model.crop(len(seq) - 1)
print(f"draft: {args.draft}\n\n| engine | draft step | median ms | over no head |\n| --- | --- | ---: | ---: |")
for engine, name in drafts:
    ms = statistics.median(times[engine, name])
    print(f"| {engine} | {name} | {ms:.3f} | {ms / statistics.median(times[engine, 'no head']):.2f}x |")
