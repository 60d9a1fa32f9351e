"""The data builder: records agree with the models, builds resume, ranks share the work."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import free_port, tiny_llama, tiny_tokenizer, write_prompts

import specdecpp.data.build_data as build_module
from specdecpp.checks import trim_at_eos
from specdecpp.data.build_data import (BuildDataArguments, build_batch, build_data, draft_candidates, main,
                                       recursive_rejection_acceptance)
from specdecpp.data.io import read_records
from specdecpp.engine.draft_step import EagerDraft
from specdecpp.engine.processing import build_processing
from specdecpp.engine.sampling import make_warpers, residual_distribution, widened
from specdecpp.engine.settings import DecodingSettings
from specdecpp.models import PairArguments, load_model

N_PROMPTS, MAX_NEW = 7, 8


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    return write_prompts(tmp_path_factory.mktemp("prompts") / "prompts.jsonl", N_PROMPTS)


@pytest.fixture(scope="module")
def loaded(pair_dirs):
    return tuple(load_model(d) for d in pair_dirs)


def args_for(pair_dirs, prompts_file, out, **kw) -> tuple[PairArguments, BuildDataArguments]:
    return PairArguments(target=pair_dirs[0], draft=pair_dirs[1]), BuildDataArguments(
        prompts=prompts_file, output=str(out), max_new_tokens=kw.pop("max_new_tokens", MAX_NEW), **kw)


def assert_same_records(path_a, path_b):
    """Same prompts, tokens, proposals and p_acc; log-probs equal up to the rounding that a
    different padding (another batch composition) brings."""
    a, b = read_records(path_a), read_records(path_b)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for key in ("index", "prompt", "prefix", "continuation", "tokens", "draft", "p_acc"):
            assert x[key] == y[key], key
        for key in ("log_p_draft", "log_p_target"):
            torch.testing.assert_close(torch.tensor(x[key]), torch.tensor(y[key]))


def teacher_forced(model, prefix, tokens):
    """Logits predicting each continuation token, recomputed unbatched without padding."""
    ids = torch.tensor([prefix + tokens])
    with torch.no_grad():
        return model(ids).logits[0, len(prefix) - 1: -1]


@pytest.mark.parametrize("batch_size", [1, 3])
def test_greedy_records_match_recomputation(pair_dirs, prompts_file, loaded, tmp_path, batch_size):
    build_data(*args_for(pair_dirs, prompts_file, tmp_path / "out.jsonl", batch_size=batch_size))
    records = read_records(tmp_path / "out.jsonl")
    target, draft = loaded
    tokenizer = tiny_tokenizer()
    assert [r["index"] for r in records] == list(range(N_PROMPTS))
    for record in records:
        assert record["prefix"] == tokenizer(record["prompt"])["input_ids"]
        generated = target.generate(torch.tensor([record["prefix"]]), max_new_tokens=MAX_NEW, do_sample=False,
                                    pad_token_id=0, eos_token_id=2)[0, len(record["prefix"]):].tolist()
        assert record["tokens"] == trim_at_eos(generated, {2})
        t_logits = teacher_forced(target, record["prefix"], record["tokens"])
        d_logits = teacher_forced(draft, record["prefix"], record["tokens"])
        proposals = d_logits.argmax(-1)
        assert record["draft"] == proposals.tolist()
        torch.testing.assert_close(torch.tensor(record["log_p_draft"], dtype=torch.float64),
                                   d_logits.log_softmax(-1).gather(-1, proposals[:, None])[:, 0])
        torch.testing.assert_close(torch.tensor(record["log_p_target"], dtype=torch.float64),
                                   t_logits.log_softmax(-1).gather(-1, proposals[:, None])[:, 0])
        assert record["p_acc"] == (proposals == t_logits.argmax(-1)).double().tolist()
    p_acc = [p for r in records for p in r["p_acc"]]
    assert 0 < sum(p_acc) < len(p_acc), "the pair should agree sometimes and disagree sometimes"


def test_sampling_records_match_recomputation(pair_dirs, prompts_file, loaded, tmp_path):
    settings = dict(do_sample=True, temperature=0.8, top_k=20, batch_size=3, seed=5)
    build_data(*args_for(pair_dirs, prompts_file, tmp_path / "a.jsonl", **settings))
    records = read_records(tmp_path / "a.jsonl")
    target, draft = loaded
    warpers = make_warpers(0.8, 20, 1.0)
    for record in records:
        q = warpers(None, widened(teacher_forced(draft, record["prefix"], record["tokens"]))).softmax(-1)
        p = warpers(None, widened(teacher_forced(target, record["prefix"], record["tokens"]))).softmax(-1)
        proposals = torch.tensor(record["draft"])
        q_tok, p_tok = q.gather(-1, proposals[:, None])[:, 0], p.gather(-1, proposals[:, None])[:, 0]
        assert (q_tok > 0).all(), "a sampled proposal must have mass under the warped draft distribution"
        torch.testing.assert_close(torch.tensor(record["log_p_draft"], dtype=torch.float64), q_tok.log())
        torch.testing.assert_close(torch.tensor(record["log_p_target"], dtype=torch.float64), p_tok.log())
        torch.testing.assert_close(torch.tensor(record["p_acc"], dtype=torch.float64), (p_tok / q_tok).clamp(max=1))
    # the target's continuation is sampled too: with this temperature some differ from greedy
    greedy = [target.generate(torch.tensor([r["prefix"]]), max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=0)
              [0, len(r["prefix"]):].tolist() for r in records]
    assert any(trim_at_eos(g, {2}) != r["tokens"] for g, r in zip(greedy, records))
    # seeded: the same settings give the same file, another seed another one
    build_data(*args_for(pair_dirs, prompts_file, tmp_path / "b.jsonl", **settings))
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()
    build_data(*args_for(pair_dirs, prompts_file, tmp_path / "c.jsonl", **(settings | {"seed": 6})))
    assert (tmp_path / "a.jsonl").read_text() != (tmp_path / "c.jsonl").read_text()


@torch.no_grad()
def engine_steps(model, record: dict, settings: DecodingSettings, generator=None) -> list:
    """The engine's step at each continuation position of `record`: `model` run as the eager loop
    runs a draft, under the processing `settings` build, each position with its own prefix (the
    target run this way gives its processed distribution, which the loop verifies with)."""
    prefix, tokens = record["prefix"], record["tokens"]
    config = settings.generation_config(len(prefix), {2})
    stepper = EagerDraft(model, build_processing(model, config, torch.tensor([prefix])))
    return [stepper.draft_step(prefix + tokens[:i], 1, generator) for i in range(len(tokens))]


@pytest.mark.parametrize("batch_size", [1, 3])
def test_greedy_records_with_a_repetition_penalty_are_the_engines_decisions(pair_dirs, prompts_file, loaded,
                                                                             tmp_path, batch_size):
    build_data(*args_for(pair_dirs, prompts_file, tmp_path / "plain.jsonl"))
    build_data(*args_for(pair_dirs, prompts_file, tmp_path / "out.jsonl", batch_size=batch_size,
                         repetition_penalty=1.5))
    records, plain = read_records(tmp_path / "out.jsonl"), read_records(tmp_path / "plain.jsonl")
    target, draft = loaded
    settings = DecodingSettings(max_new_tokens=MAX_NEW, repetition_penalty=1.5)
    for record in records:
        assert record["processing"] == {"repetition_penalty": 1.5}
        generated = target.generate(torch.tensor([record["prefix"]]), max_new_tokens=MAX_NEW, do_sample=False,
                                    repetition_penalty=1.5, pad_token_id=0, eos_token_id=2)
        assert record["tokens"] == trim_at_eos(generated[0, len(record["prefix"]):].tolist(), {2})
        drafted, verified = engine_steps(draft, record, settings), engine_steps(target, record, settings)
        assert [step.token for step in verified] == record["tokens"]  # the target's processed argmax
        assert record["draft"] == [step.token for step in drafted]
        assert record["p_acc"] == [float(d.token == t.token) for d, t in zip(drafted, verified)]
        for name, steps in (("log_p_draft", drafted), ("log_p_target", verified)):
            torch.testing.assert_close(torch.tensor(record[name], dtype=torch.float64),
                                       torch.stack([s.probs[y] for s, y in zip(steps, record["draft"])]).log())
    assert [r["tokens"] for r in records] != [r["tokens"] for r in plain], "the penalty should change continuations"
    assert all(r["processing"] == {} for r in plain)


def test_sampled_records_with_a_repetition_penalty_follow_the_engines_distributions(pair_dirs, prompts_file, loaded,
                                                                                     tmp_path):
    flags = dict(do_sample=True, temperature=0.8, top_k=20, repetition_penalty=1.5, batch_size=3, seed=5)
    build_data(*args_for(pair_dirs, prompts_file, tmp_path / "out.jsonl", **flags))
    target, draft = loaded
    settings = DecodingSettings(max_new_tokens=MAX_NEW, do_sample=True, temperature=0.8, top_k=20,
                                repetition_penalty=1.5)
    generator = torch.Generator().manual_seed(0)
    for record in read_records(tmp_path / "out.jsonl"):
        proposals = torch.tensor(record["draft"])[:, None]
        q, p = (torch.stack([s.probs for s in engine_steps(model, record, settings, generator)]).gather(-1, proposals)[:, 0]
                for model in (draft, target))
        assert (q > 0).all(), "a sampled proposal must have mass under the processed draft distribution"
        torch.testing.assert_close(torch.tensor(record["log_p_draft"], dtype=torch.float64), q.log())
        torch.testing.assert_close(torch.tensor(record["log_p_target"], dtype=torch.float64), p.log())
        torch.testing.assert_close(torch.tensor(record["p_acc"], dtype=torch.float64), (p / q).clamp(max=1))


# A hand-checkable position: the draft rates tokens 0 > 1 > 2 and rules out 3; the target prefers 2.
Q, P = torch.tensor([[0.5, 0.3, 0.2, 0.0]]), torch.tensor([[0.2, 0.2, 0.6, 0.0]])


def test_greedy_candidates_are_the_drafts_top_tokens_labelled_by_the_targets_choice():
    candidates, labels = draft_candidates(Q.log(), P.log(), torch.tensor([0]), 4, None, torch.tensor([2]))
    assert candidates == [[0, 1, 2]], "a token the draft rules out is no candidate"
    assert labels == [[0.0, 0.0, 1.0]]
    assert draft_candidates(Q.log(), P.log(), torch.tensor([0]), 2, None, torch.tensor([2])) == ([[0, 1]], [[0.0, 0.0]])


@pytest.mark.parametrize("order, expected", [([0, 1, 2], [0.4, 0.0, 1.0]), ([0, 2, 1], [0.4, 1.0, 0.0]),
                                             ([1, 0, 2], [2 / 3, 0.0, 1.0])])
def test_recursive_rejection_acceptance_by_hand(order, expected):
    # 0 first: min(1, .2/.5) = .4, then r = norm(max(0, p - q)) = [0, 0, 1, 0] and q = [0, .6, .4, 0]: 1 gets
    # 0/.6, 2 gets min(1, 1/.4). 1 first: min(1, .2/.3), then r = [0, 0, 1, 0] gives 0 to 0 and everything to 2.
    labels = recursive_rejection_acceptance(Q.log(), P.log(), torch.tensor([order]))
    torch.testing.assert_close(labels, torch.tensor([expected], dtype=torch.float64))


def test_sampled_candidates_emit_exactly_the_target_distribution():
    """Every order the draw can give, weighted by its chance, accepting each candidate with its label and
    falling back on the last residual: the emitted token follows `p` (recursive rejection sampling is lossless)."""
    from itertools import permutations

    q, p = torch.tensor([[0.4, 0.3, 0.2, 0.1]]), torch.tensor([[0.1, 0.15, 0.35, 0.4]])
    emitted = torch.zeros(4, dtype=torch.float64)
    for order in permutations(range(4), 3):
        chance, left = 1.0, q[0].double().clone()
        for x in order:
            chance *= float(left[x] / left.sum())
            left[x] = 0
        labels = recursive_rejection_acceptance(q.log(), p.log(), torch.tensor([order]))[0]
        r, q_j, reached = p[0].double(), q[0].double(), chance
        for x, label in zip(order, labels.tolist()):
            emitted[x] += reached * label
            reached *= 1 - label
            r, q_j = residual_distribution(r, q_j), q_j.scatter(0, torch.tensor([x]), 0.0)
            q_j = q_j / q_j.sum()
        emitted += reached * r
    torch.testing.assert_close(emitted, p[0].double())


def test_sampled_candidates_are_drawn_without_replacement_the_proposal_first():
    n = 20_000
    q = Q.expand(n, 4)
    proposals = torch.zeros(n, dtype=torch.long)  # given the proposal 0, the next is 1 w.p. .3/.5, 2 w.p. .2/.5
    candidates, labels = draft_candidates(q.log(), P.log().expand(n, 4), proposals, 4, torch.Generator().manual_seed(0),
                                          torch.full((n,), 2))
    assert all(c[0] == 0 and sorted(c) == [0, 1, 2] for c in candidates)
    second = torch.tensor([c[1] for c in candidates])
    assert abs((second == 1).double().mean().item() - 0.6) < 0.015
    assert all(label == ([0.4, 0.0, 1.0] if c == [0, 1, 2] else [0.4, 1.0, 0.0]) for c, label in
               zip(candidates[:50], [[round(v, 6) for v in row] for row in labels[:50]]))


def test_records_keep_the_drafts_candidates(pair_dirs, prompts_file, loaded, tmp_path):
    build_data(*args_for(pair_dirs, prompts_file, tmp_path / "cand.jsonl", batch_size=3, num_candidates=3))
    build_data(*args_for(pair_dirs, prompts_file, tmp_path / "none.jsonl", batch_size=3, num_candidates=0))
    with_candidates, without = read_records(tmp_path / "cand.jsonl"), read_records(tmp_path / "none.jsonl")
    target, draft = loaded
    for record, plain in zip(with_candidates, without):
        assert "candidates" not in plain and "candidate_p_acc" not in plain
        assert {k: v for k, v in record.items() if not k.startswith("candidate")} == plain, "nothing else changes"
        d_logits = teacher_forced(draft, record["prefix"], record["tokens"])
        t_choice = teacher_forced(target, record["prefix"], record["tokens"]).argmax(-1)
        assert record["candidates"] == d_logits.topk(3).indices.tolist()
        assert record["candidate_p_acc"] == (d_logits.topk(3).indices == t_choice[:, None]).double().tolist()
        assert [c[0] for c in record["candidate_p_acc"]] == record["p_acc"]
    labels = [sum(c) for r in with_candidates for c in r["candidate_p_acc"]]
    assert max(labels) == 1.0 and any(c[1:] != [0.0, 0.0] for r in with_candidates for c in r["candidate_p_acc"])


def test_sampled_records_keep_candidates_drawn_after_the_proposal(pair_dirs, prompts_file, loaded, tmp_path):
    flags = dict(do_sample=True, temperature=0.8, top_k=3, batch_size=3, seed=5)
    build_data(*args_for(pair_dirs, prompts_file, tmp_path / "cand.jsonl", num_candidates=4, **flags))
    build_data(*args_for(pair_dirs, prompts_file, tmp_path / "none.jsonl", num_candidates=0, **flags))
    target, draft = loaded
    warpers = make_warpers(0.8, 3, 1.0)
    for record, plain in zip(read_records(tmp_path / "cand.jsonl"), read_records(tmp_path / "none.jsonl")):
        assert {k: v for k, v in record.items() if not k.startswith("candidate")} == plain, "the same draws"
        q = warpers(None, widened(teacher_forced(draft, record["prefix"], record["tokens"]))).softmax(-1)
        p = warpers(None, widened(teacher_forced(target, record["prefix"], record["tokens"]))).softmax(-1)
        for i, (candidates, labels) in enumerate(zip(record["candidates"], record["candidate_p_acc"])):
            assert len(candidates) == len(set(candidates)) == 3, "top-k 3 leaves three tokens with mass"
            assert candidates[0] == record["draft"][i] and labels[0] == record["p_acc"][i]
            expected = recursive_rejection_acceptance(q[i:i + 1].log(), p[i:i + 1].log(), torch.tensor([candidates]))
            torch.testing.assert_close(torch.tensor([labels], dtype=torch.float64), expected, atol=1e-5, rtol=1e-4)


def test_continuations_stop_at_eos(loaded):
    target, draft = loaded
    prefixes = [[1, 5, 9, 14], [1, 30], [1, 7, 7, 22, 40, 41]]
    free = build_batch(target, draft, prefixes, max_new_tokens=MAX_NEW)
    eos = free[0]["tokens"][2]  # a token the target really produces: call it EOS
    records = build_batch(target, draft, prefixes, max_new_tokens=MAX_NEW, eos_token_ids={eos})
    for before, after in zip(free, records):
        assert after["tokens"] == trim_at_eos(before["tokens"], {eos})
        assert all(len(after[k]) == len(after["tokens"]) for k in ("draft", "log_p_draft", "log_p_target", "p_acc"))
        assert after["draft"] == before["draft"][: len(after["tokens"])]
    assert records[0]["tokens"][-1] == eos and len(records[0]["tokens"]) <= 3
    assert trim_at_eos([4, 2, 0, 0], {2}) == [4, 2] and trim_at_eos([4, 5], {2}) == [4, 5]


def test_interrupted_build_resumes_without_loss_or_duplicates(pair_dirs, prompts_file, tmp_path, monkeypatch):
    build_data(*args_for(pair_dirs, prompts_file, tmp_path / "full.jsonl", batch_size=2))
    out = tmp_path / "resumed.jsonl"
    calls = {"n": 0}
    real_build_batch = build_module.build_batch

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real_build_batch(*args, **kwargs)

    monkeypatch.setattr(build_module, "build_batch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build_data(*args_for(pair_dirs, prompts_file, out, batch_size=2))
    assert not out.exists(), "an unfinished build must not leave a file that looks complete"
    shard = tmp_path / "resumed.jsonl.parts" / "rank0.jsonl"
    assert len(shard.read_text().splitlines()) == 4
    with open(shard, "a") as f:  # an interruption in the middle of writing a line
        f.write('{"index": 4, "prompt": "cut sh')
    monkeypatch.setattr(build_module, "build_batch", real_build_batch)
    for other in ({"max_new_tokens": 5}, {"repetition_penalty": 1.2}):  # other settings: refuse to mix them in
        with pytest.raises(ValueError, match="--overwrite"):
            build_data(*args_for(pair_dirs, prompts_file, out, batch_size=2, **other))
    stats = build_data(*args_for(pair_dirs, prompts_file, out, batch_size=3))  # batch size may change
    assert stats["new_tokens"] <= (N_PROMPTS - 4) * MAX_NEW
    assert_same_records(out, tmp_path / "full.jsonl")
    assert not (tmp_path / "resumed.jsonl.parts").exists()


def test_existing_output_is_refused_unless_overwrite(pair_dirs, prompts_file, tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text("precious\n")
    with pytest.raises(ValueError, match="--overwrite"):
        build_data(*args_for(pair_dirs, prompts_file, out, n_end=2))
    assert out.read_text() == "precious\n"
    build_data(*args_for(pair_dirs, prompts_file, out, n_begin=2, n_end=4, overwrite=True))
    assert [r["index"] for r in read_records(out)] == [2, 3]


@pytest.mark.parametrize("bad", [{"max_new_tokens": 0}, {"temperature": 0.0}, {"top_p": 1.5},
                                 {"prompt_format": "alpaca"}, {"output": "x.json"}, {"repetition_penalty": 0.0},
                                 {"num_candidates": -1}])
def test_bad_arguments_fail_before_loading(pair_dirs, prompts_file, tmp_path, bad):
    with pytest.raises(ValueError):
        args_for(pair_dirs, prompts_file, bad.pop("output", tmp_path / "o.jsonl"), **bad)


def test_a_run_refused_by_a_check_leaves_nothing_and_the_corrected_rerun_is_accepted(pair_dirs, prompts_file,
                                                                                   tmp_path):
    other = tmp_path / "other_draft"
    tiny_llama(vocab_size=80).save_pretrained(other)
    out = tmp_path / "out.jsonl"
    with pytest.raises(ValueError, match=r"vocabulary \(64\) and draft vocabulary \(80\) differ"):
        build_data(PairArguments(target=pair_dirs[0], draft=str(other)),
                   BuildDataArguments(prompts=prompts_file, output=str(out), max_new_tokens=MAX_NEW, n_end=2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other_draft"], "a refused run writes nothing"
    build_data(*args_for(pair_dirs, prompts_file, out, n_end=2))  # the corrected rerun, without --overwrite
    assert [r["index"] for r in read_records(out)] == [0, 1]


def test_a_draft_with_recurrent_layers_is_refused(pair_dirs, prompts_file, tmp_path):
    from conftest import tiny_recurrent

    recurrent = tmp_path / "jamba_draft"
    tiny_recurrent("jamba").save_pretrained(recurrent)
    with pytest.raises(ValueError, match=r"the draft \(JambaForCausalLM\) has recurrent layers"):
        build_data(PairArguments(target=pair_dirs[0], draft=str(recurrent)),
                   BuildDataArguments(prompts=prompts_file, output=str(tmp_path / "out.jsonl"), max_new_tokens=MAX_NEW,
                                      n_end=2))


@pytest.mark.parametrize("flags, message", [
    (["--output", "x.json"], "--output must end in .jsonl"),
    (["--output", "x.jsonl", "--prompts", "no/such.jsonl"], "no prompt file at no/such.jsonl"),
])
def test_the_command_reports_bad_input_in_one_line(pair_dirs, flags, message):
    with pytest.raises(SystemExit) as exit_:
        main(["--target", pair_dirs[0], "--draft", pair_dirs[1], "--prompts", "humaneval", *flags])
    assert exit_.value.code.startswith(f"specdecpp build-data: error: {message}")


@pytest.mark.slow  # torchrun
def test_torchrun_two_ranks_build_the_same_file(pair_dirs, prompts_file, tmp_path):
    single = tmp_path / "single.jsonl"
    build_data(*args_for(pair_dirs, prompts_file, single, batch_size=2))
    out = tmp_path / "ranks.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "-m", "specdecpp.data.build_data", "--target", pair_dirs[0], "--draft", pair_dirs[1],
           "--prompts", prompts_file, "--output", str(out), "--max_new_tokens", str(MAX_NEW), "--batch_size", "2"]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tokens/s" in result.stdout
    assert_same_records(out, single)
