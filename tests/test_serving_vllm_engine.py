"""The SpecDec++ proposer inside vLLM (`specdecpp.serving.vllm`) on the embedded pair: greedy output
equal to vLLM without speculation and to `target.generate` at concurrency 1 and 8 (stop tokens and
`max_tokens` inside a round, requests finishing at different steps), a request alone drafting the
rounds of `speculative_generate`, a fixed-K control counted as vLLM's own `draft_model`, clear
errors, and the OpenAI server. Runs where vLLM is installed: `.ci/run` builds that environment
(tests/test_serving_vllm.py tests the proposer's bookkeeping without vLLM)."""
from __future__ import annotations

import gc
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

# An engine in this process (its proposer reachable for the tests), with a small KV cache.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
vllm = pytest.importorskip("vllm")

import torch  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from specdecpp import speculative_generate  # noqa: E402
from specdecpp.models import load_head, load_model  # noqa: E402

ZOO = Path(__file__).resolve().parents[1] / "checkpoints" / "zoo"
PROPOSER = "specdecpp.serving.vllm.SpecDecPPProposer"
PROMPTS = ["def add(a, b):\n", "import os\n", "class Stack:\n    def __init__(self):\n", "for i in range(10):\n",
           "    return self.", "def parse(path):\n    with open(path) as f:\n", "# Copyright", "x = [1, 2, 3]\n"]
MAX_TOKENS = [48, 17, 64, 9, 33, 40, 5, 24]  # requests finish at different steps, some inside a round
NEWLINE = 199  # the zoo tokenizer's "\n": a stop token that falls inside drafted runs
ENGINE = {"distributed_executor_backend": "uni", "enforce_eager": True, "max_model_len": 1024, "max_num_seqs": 8,
          "dtype": "float32", "disable_log_stats": False, "seed": 0}
ADA = {"draft": str(ZOO / "draft"), "head": str(ZOO / "head"), "stop_threshold": "auto", "bound": [1, 20]}


def run_engine(speculative_config=None, additional_config=None, concurrency: int = 8, stop: bool = False):
    """Greedy outputs of PROMPTS from an in-process vLLM engine, `concurrency` requests at a time,
    its speculative counters, and (with our proposer) each request's draft lengths in prompt order."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(ZOO / "target"), speculative_config=speculative_config,
              additional_config=additional_config or {}, **ENGINE)
    params = [SamplingParams(temperature=0, max_tokens=n, stop_token_ids=[NEWLINE] if stop and i % 2 else None)
              for i, n in enumerate(MAX_TOKENS)]
    outputs, lengths = [], []
    for start in range(0, len(PROMPTS), concurrency):
        batch = llm.generate(PROMPTS[start:start + concurrency], params[start:start + concurrency], use_tqdm=False)
        outputs += [list(o.outputs[0].token_ids) for o in batch]
        if speculative_config and speculative_config["model"] == PROPOSER and concurrency == 1:
            lengths += llm.collective_rpc(_last_request_lengths)
    counters = {m.name.removeprefix("vllm:spec_decode_"): m.value for m in llm.get_metrics()
                if m.name.startswith("vllm:spec_decode_num") and hasattr(m, "value")}
    del llm
    gc.collect()
    return outputs, counters, lengths


def _last_request_lengths(worker) -> list[int]:
    requests = worker.model_runner.drafter.caches.requests
    return list(requests.values())[-1].draft_lengths


@pytest.fixture(scope="module")
def runs():
    """Every engine the tests compare, run once (one engine alive at a time)."""
    spec = {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": 20}
    k3 = {"num_speculative_tokens": 3}
    return {
        "plain": run_engine(),
        "plain stop": run_engine(stop=True),
        "ada 8": run_engine(spec, {"specdecpp": ADA}),
        "ada 8 stop": run_engine(spec, {"specdecpp": ADA}, stop=True),
        "ada 1": run_engine(spec, {"specdecpp": ADA}, concurrency=1),
        "constant 3": run_engine({**spec, **k3}, {"specdecpp": {"draft": str(ZOO / "draft"), "schedule": "constant",
                                                                "num_assistant_tokens": 3}}),
        "draft_model 3": run_engine({"method": "draft_model", "model": str(ZOO / "draft"), **k3}),
    }


@pytest.fixture(scope="module")
def pair():
    return load_model(str(ZOO / "target")), load_model(str(ZOO / "draft")), AutoTokenizer.from_pretrained(ZOO / "target")


def test_greedy_output_equals_vllm_without_speculation_and_target_generate(runs, pair):
    target, _, tokenizer = pair
    plain = runs["plain"][0]
    assert runs["ada 8"][0] == plain
    assert runs["ada 1"][0] == plain
    assert runs["ada 8 stop"][0] == runs["plain stop"][0]
    assert runs["plain stop"][0] != plain  # the stop token did end some requests early
    for prompt, n, generated in zip(PROMPTS, MAX_TOKENS, plain):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n)
        assert generated == out[0, ids.shape[1]:].tolist()


def test_the_proposer_drafted_and_vllm_verified_it(runs):
    counters = runs["ada 8"][1]
    assert counters["num_drafts"] > 0 and 0 < counters["num_accepted_tokens"] < counters["num_draft_tokens"]


def test_a_request_alone_drafts_the_rounds_of_speculative_generate(runs, pair):
    # vLLM's prefill samples the first token, so its rounds are the engine's after prompt + that token.
    # vLLM asks for one more proposal in the step that ends a request, which it never verifies: the
    # verified rounds are all but the last.
    target, draft, tokenizer = pair
    head = load_head(str(ZOO / "head"))
    for prompt, generated, lengths in zip(PROMPTS, runs["plain"][0], runs["ada 1"][2]):
        first = torch.cat([tokenizer(prompt, return_tensors="pt").input_ids, torch.tensor([generated[:1]])], dim=1)
        engine = speculative_generate(target, draft, first, head=head, stop_threshold="auto", bound=(1, 20),
                                      max_new_tokens=len(generated) + 25)
        assert lengths[:-1] == engine.stats.draft_lengths[:len(lengths) - 1], prompt
    assert len({n for lengths in runs["ada 1"][2] for n in lengths}) > 2  # the lengths do vary


def test_a_fixed_k_control_counts_as_vllms_draft_model(runs):
    assert runs["constant 3"][0] == runs["plain"][0]
    assert runs["constant 3"][1] == runs["draft_model 3"][1]
    assert runs["constant 3"][1]["num_draft_tokens"] == 3 * runs["constant 3"][1]["num_drafts"] > 0


@pytest.mark.parametrize("section, message", [
    ({"head": str(ZOO / "head")}, "'draft'] is missing"),
    ({"draft": str(ZOO / "draft"), "schedule": "sometimes"}, "'schedule'] is 'sometimes'"),
])
def test_bad_configuration_is_a_clear_error(section, message):
    from vllm import LLM

    with pytest.raises(Exception) as error:
        LLM(model=str(ZOO / "target"), speculative_config={"method": "custom_class", "model": PROPOSER,
                                                           "num_speculative_tokens": 5},
            additional_config={"specdecpp": section}, **ENGINE)
    assert message in str(error.value) or message in repr(error.value.__cause__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_completions(extra_args: list[str], prompts: list[str], max_tokens: int = 32) -> tuple[list[str], str]:
    """Start vLLM's OpenAI server on the loopback address, send one greedy completion per prompt
    (bounded: a few requests, each with a timeout), read `/metrics`, stop the server."""
    port = _free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    server = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(ZOO / "target"),
                               "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager",
                               "--max-model-len", "1024", "--max-num-seqs", "8", *extra_args],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 240
        while True:
            try:
                urllib.request.urlopen(f"{base}/health", timeout=5)
                break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"the vLLM server did not start:\n{server.stderr.read()[-3000:]}") from None
                time.sleep(1)
        texts = []
        for prompt in prompts:
            body = json.dumps({"model": str(ZOO / "target"), "prompt": prompt, "max_tokens": max_tokens,
                               "temperature": 0}).encode()
            request = urllib.request.Request(f"{base}/v1/completions", body, {"Content-Type": "application/json"})
            texts.append(json.load(urllib.request.urlopen(request, timeout=60))["choices"][0]["text"])
        metrics = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    return texts, metrics


def metric(metrics: str, name: str) -> float:
    """A counter's value summed over its labels in Prometheus' text format."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def test_the_openai_server_serves_a_head(runs):
    speculative = ["--speculative-config", json.dumps({"method": "custom_class", "model": PROPOSER,
                                                       "num_speculative_tokens": 20}),
                   "--additional-config", json.dumps({"specdecpp": ADA})]
    texts, metrics = serve_completions(speculative, PROMPTS[:4])
    plain, _ = serve_completions([], PROMPTS[:4])
    assert texts == plain
    drafts, accepted = metric(metrics, "vllm:spec_decode_num_drafts_total"), \
        metric(metrics, "vllm:spec_decode_num_accepted_tokens_total")
    assert drafts > 0 and accepted > 0
