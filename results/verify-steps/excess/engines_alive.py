"""`dynamic`@0.4 compiled generations (held-out functions 1-6, 128 tokens) with one to four target and draft
engines alive (the extra ones built for larger capacities and never used): ms a token, and the verifying and
drafting parts (one thread).

    python results/verify-steps/excess/engines_alive.py
"""
from zoo import zoo

from specdecpp import speculative_generate
from specdecpp.engine import compiled
from specdecpp.engine.decoding import step_models
from specdecpp.engine.processing import sampling_only
from specdecpp.engine.settings import DecodingSettings

target, draft, _, prompts = zoo(0, 7)
knobs = dict(schedule="dynamic", num_assistant_tokens=20, assistant_confidence_threshold=0.4)


def per_token() -> str:
    runs = [speculative_generate(target, draft, p, max_new_tokens=128, eos_token_id=[], compile=True, **knobs).stats
            for p in prompts[1:]]
    tokens = sum(s.generated_length for s in runs)
    return " | ".join(f"{1000 * sum(getattr(s, part) for s in runs) / tokens:.3f}"
                      for part in ("wall_time", "verify_time", "draft_time"))


speculative_generate(target, draft, prompts[0], max_new_tokens=128, eos_token_id=[], compile=True, **knobs)
print("| engines per model | ms/token | verifying | drafting |")
print("| ---: | ---: | ---: | ---: |")
print(f"| 1 | {per_token()} |")
for extra in (1, 2, 3):
    step_models(target, draft, DecodingSettings(compile=True, **knobs), sampling_only(False), 256 << extra)
    print(f"| {len(compiled._engines[target])} | {per_token()} |")
