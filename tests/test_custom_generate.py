"""SpecDec++ from transformers' `generate`: the head folder form (`custom_generate=HEAD_DIR`), the callable
form (`custom_generate=specdecpp.hf_generate`), and `speculative_generate` fed the way transformers users
feed `generate` (`**tokenizer(...)`). All on the committed pair, offline."""
from __future__ import annotations

import functools
import shutil

import pytest
import torch
from conftest import ZOO_DIR
from transformers import TextIteratorStreamer
from transformers.generation import GenerateDecoderOnlyOutput

import specdecpp
from specdecpp.measuring import step_timing
from specdecpp.measuring.step_timing import auto_step_times
from specdecpp import AcceptancePredictionHead, speculative_generate
from specdecpp.custom_generate import SpeculativeGenerateOutput
from specdecpp.engine.online import OnlineAcceptanceEstimator
from specdecpp.engine.schedules import SCHEDULES
from specdecpp.evaluation.methods import method_settings, method_specs
from specdecpp.evaluation.arguments import DecodingArguments, MethodGrid
from specdecpp.head.folder import CUSTOM_GENERATE_FILES
from specdecpp.serving.vllm import section_settings

HEAD_DIR = str(ZOO_DIR / "head")
PROMPTS = ("def add(a, b):\n", "import os\n\nclass Config:\n    def __init__(self")


def folder_generate(target, draft, inputs, **kwargs):
    return target.generate(**inputs, assistant_model=draft, custom_generate=HEAD_DIR, trust_remote_code=True, **kwargs)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_folder_form_greedy_equals_target_generate(zoo, prompt):
    target, draft, tokenizer = zoo
    inputs = tokenizer(prompt, return_tensors="pt")
    expected = target.generate(**inputs, max_new_tokens=30, do_sample=False)
    out = folder_generate(target, draft, inputs, max_new_tokens=30, do_sample=False, stop_threshold=0.5, bound=(1, 8))
    assert isinstance(out, torch.Tensor) and torch.equal(out, expected)


@pytest.mark.slow  # compiles the zoo pair
@pytest.mark.skipif(not specdecpp.engine.compiled.STATIC_CACHE_CROPS, reason="transformers < 5.24: compile=True is refused")
def test_folder_form_runs_the_compiled_engine_when_asked(zoo):
    target, draft, tokenizer = zoo
    inputs = tokenizer(PROMPTS[0], return_tensors="pt")
    expected = target.generate(**inputs, max_new_tokens=30, do_sample=False)
    # A threshold given: "auto" would time the compiled steps first (unless kept from an earlier test), compiling there.
    out = folder_generate(target, draft, inputs, max_new_tokens=30, do_sample=False, return_dict_in_generate=True,
                          compile=True, stop_threshold=0.3)
    assert torch.equal(out.sequences, expected)
    again = folder_generate(target, draft, inputs, max_new_tokens=30, do_sample=False, return_dict_in_generate=True,
                            compile=True, stop_threshold=0.3)
    assert out.stats.compile_time > 0 and again.stats.compile_time == 0  # it compiled, once


def test_folder_form_returns_a_generate_output_and_passes_the_specdec_knobs(zoo):
    target, draft, tokenizer = zoo
    inputs = tokenizer(PROMPTS[1], return_tensors="pt")
    runs = {threshold: folder_generate(target, draft, inputs, max_new_tokens=40, return_dict_in_generate=True,
                                       stop_threshold=threshold, bound=(1, 8))
            for threshold in (0.05, 0.95)}
    for out in runs.values():
        assert isinstance(out, GenerateDecoderOnlyOutput) and isinstance(out, SpeculativeGenerateOutput)
        assert out.stats.generated_length == out.sequences.shape[1] - inputs["input_ids"].shape[1]
        assert max(out.stats.draft_lengths) <= 8
    assert torch.equal(runs[0.05].sequences, runs[0.95].sequences)
    # a higher threshold lets rounds run longer: the knob reached the ada schedule
    mean = {t: sum(o.stats.draft_lengths) / len(o.stats.draft_lengths) for t, o in runs.items()}
    assert mean[0.95] > mean[0.05]


def test_hub_id_form_loads_the_repo_head_the_ordinary_way(zoo, tmp_path):
    """A Hub id, served offline from a Hub cache: the head is the repo's (one that always predicts a
    rejection, so every ada round stops at the lower bound), loaded with the call's Hub options."""
    target, draft, tokenizer = zoo
    repo = tmp_path / "models--me--zoo-head"
    snapshot = repo / "snapshots" / ("0" * 40)
    shutil.copytree(HEAD_DIR, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    pessimist = AcceptancePredictionHead.from_pretrained(HEAD_DIR)
    with torch.no_grad():
        pessimist.model[-1].weight.zero_()
        pessimist.model[-1].bias.copy_(torch.tensor([30.0, -30.0]))
    pessimist.save_pretrained(snapshot)
    inputs = tokenizer(PROMPTS[1], return_tensors="pt")
    out = target.generate(**inputs, assistant_model=draft, custom_generate="me/zoo-head", trust_remote_code=True,
                          cache_dir=str(tmp_path), local_files_only=True, max_new_tokens=30,
                          return_dict_in_generate=True, bound=(3, 8), stop_threshold=0.99)
    assert torch.equal(out.sequences, target.generate(**inputs, max_new_tokens=30))
    produced, expected = 0, []  # every round stops at the lower bound 3, unless max_new_tokens cuts it shorter
    for accepted in out.stats.accepted_lengths:
        expected.append(min(3, 30 - produced - 1))
        produced += accepted + 1
    assert out.stats.draft_lengths == expected


def test_the_stored_threshold_and_its_bound_are_the_defaults(zoo, monkeypatch):
    target, draft, tokenizer = zoo
    # Timed once where the head's stored times came from elsewhere; one timing pass is enough here.
    monkeypatch.setattr(step_timing, "device_step_times", functools.partial(step_timing.device_step_times, repeats=1))
    head = AcceptancePredictionHead.from_pretrained(HEAD_DIR)
    assert head.stop_threshold is not None and head.threshold_selection["bound"]
    inputs = tokenizer(PROMPTS[1], return_tensors="pt")
    settings = dict(max_new_tokens=40, return_dict_in_generate=True)
    default = folder_generate(target, draft, inputs, **settings)
    # "auto": the stored threshold, chosen again for this device's step times where they differ
    times = auto_step_times(head, target, draft)
    assert default.stats.stop_threshold == (head.stop_threshold if times is None else head.threshold_for(times))
    assert "cpu eager" in default.stats.threshold_step_times
    stored = folder_generate(target, draft, inputs, stop_threshold=default.stats.stop_threshold,
                             bound=tuple(head.threshold_selection["bound"]), **settings)
    engine_defaults = folder_generate(target, draft, inputs, stop_threshold=0.3, bound=(2, 20), **settings)
    assert default.stats.draft_lengths == stored.stats.draft_lengths
    assert default.stats.draft_lengths != engine_defaults.stats.draft_lengths


def test_the_defaults_agree_across_the_entry_points(zoo, monkeypatch, tmp_path):
    target, draft, tokenizer = zoo
    monkeypatch.setattr(step_timing, "device_step_times", functools.partial(step_timing.device_step_times, repeats=1))
    head = AcceptancePredictionHead.from_pretrained(HEAD_DIR)
    bare = AcceptancePredictionHead.from_pretrained(HEAD_DIR).with_threshold(None, None)  # no threshold selection
    bare.save_pretrained(tmp_path / "bare")
    ids = tokenizer(PROMPTS[1], return_tensors="pt").input_ids
    for chosen, folder, auto, bound in ((head, HEAD_DIR, "auto", tuple(head.threshold_selection["bound"])),
                                        (bare, str(tmp_path / "bare"), 0.3, (2, 20))):
        ours = speculative_generate(target, draft, ids, head=chosen, max_new_tokens=40).stats
        hf = target.generate(ids, custom_generate=specdecpp.hf_generate, draft=draft, head=chosen, max_new_tokens=40,
                             return_dict_in_generate=True).stats
        explicit = speculative_generate(target, draft, ids, head=chosen, stop_threshold=auto, bound=bound,
                                        max_new_tokens=40).stats
        assert ours.draft_lengths == hf.draft_lengths == explicit.draft_lengths
        assert ours.stop_threshold == hf.stop_threshold == explicit.stop_threshold
        assert (ours.stop_threshold is not None) == (auto == "auto")  # set where auto chose it
        spec = next(s for s in method_specs(MethodGrid(schedule=["ada"], baselines=[]), [folder]) if s.head)
        settings = method_settings(spec, chosen, DecodingArguments().settings())
        assert (spec.stop_threshold, settings.bound) == (auto, bound)
        section = section_settings({"specdecpp": {"head": folder}})
        assert (section.stop_threshold, section.bound) == (auto, bound)


def test_callable_form_equals_target_generate(zoo):
    target, draft, tokenizer = zoo
    inputs = tokenizer(PROMPTS[0], return_tensors="pt")
    expected = target.generate(**inputs, max_new_tokens=25)
    head = AcceptancePredictionHead.from_pretrained(HEAD_DIR)
    for head_arg in (HEAD_DIR, head):
        out = target.generate(**inputs, custom_generate=specdecpp.hf_generate, draft=draft, head=head_arg,
                              max_new_tokens=25, stop_threshold=0.7)
        assert torch.equal(out, expected)
    with pytest.raises(ValueError, match="draft="):
        target.generate(**inputs, custom_generate=specdecpp.hf_generate, head=head, max_new_tokens=5)


def test_generation_config_sampling_length_and_eos_are_honoured(zoo):
    target, draft, tokenizer = zoo
    inputs = tokenizer(PROMPTS[1], return_tensors="pt")
    prompt_length = inputs["input_ids"].shape[1]
    greedy = target.generate(**inputs, max_new_tokens=20)
    # top_k=1 leaves one token to sample: sampling then reproduces greedy decoding, so top_k was applied
    top1 = folder_generate(target, draft, inputs, max_new_tokens=20, do_sample=True, top_k=1, temperature=0.7)
    assert torch.equal(top1, greedy)
    samples = []
    for _ in range(2):
        torch.manual_seed(3)
        samples.append(folder_generate(target, draft, inputs, max_new_tokens=12, do_sample=True, temperature=1.5,
                                       top_k=0, top_p=0.95))
    assert torch.equal(samples[0], samples[1]) and samples[0].shape[1] <= prompt_length + 12
    # an EOS from the call stops generation where the target alone stops
    eos = int(greedy[0, prompt_length + 6])
    expected = target.generate(**inputs, max_new_tokens=20, eos_token_id=eos)
    out = folder_generate(target, draft, inputs, max_new_tokens=20, eos_token_id=eos)
    assert torch.equal(out, expected) and int(out[0, -1]) == eos and out.shape[1] < greedy.shape[1]


def test_a_transformers_streamer_receives_the_prompt_then_the_generated_tokens(zoo):
    target, draft, tokenizer = zoo
    inputs = tokenizer(PROMPTS[1], return_tensors="pt")
    streamer = TextIteratorStreamer(tokenizer, timeout=5)
    out = folder_generate(target, draft, inputs, max_new_tokens=25, streamer=streamer)
    assert out.shape[1] > inputs["input_ids"].shape[1] + 5
    assert "".join(streamer) == tokenizer.decode(out[0])  # iteration ends only once the streamer was ended


ZOO_SETTINGS = (dict(repetition_penalty=1.3), dict(no_repeat_ngram_size=2), dict(min_new_tokens=35),
                dict(bad_words_ids=[[13]], suppress_tokens=[11]), dict(begin_suppress_tokens=[13]),
                dict(sequence_bias={(13,): -3.0}), dict(forced_eos_token_id=0), dict(stop_strings=["b"]),
                dict(repetition_penalty=1.2, no_repeat_ngram_size=3, stop_strings=["return"], min_new_tokens=3))


@pytest.mark.parametrize("settings", ZOO_SETTINGS)
def test_folder_form_with_processing_equals_target_generate(zoo, settings):
    target, draft, tokenizer = zoo
    for prompt in PROMPTS:
        inputs = tokenizer(prompt, return_tensors="pt")
        expected = target.generate(**inputs, max_new_tokens=30, do_sample=False, tokenizer=tokenizer, **settings)
        out = folder_generate(target, draft, inputs, max_new_tokens=30, do_sample=False, tokenizer=tokenizer,
                              bound=(1, 8), **settings)
        assert torch.equal(out, expected), (prompt, settings)


@pytest.fixture(scope="module")
def all_processing_cases(zoo):
    """(inputs, target.generate's output) for each prompt under the last `ZOO_SETTINGS` but its stop strings (a
    callable gets no tokenizer from generate, transformers 5.24)."""
    target, _, tokenizer = zoo
    settings = {k: v for k, v in ZOO_SETTINGS[-1].items() if k != "stop_strings"}
    inputs = [tokenizer(prompt, return_tensors="pt") for prompt in PROMPTS]
    return settings, [(x, target.generate(**x, max_new_tokens=30, do_sample=False, **settings)) for x in inputs]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_callable_form_with_all_processing_equals_target_generate_for_every_schedule(zoo, all_processing_cases,
                                                                                     schedule):
    target, draft, _ = zoo
    settings, cases = all_processing_cases
    for inputs, expected in cases:
        out = target.generate(**inputs, custom_generate=specdecpp.hf_generate, draft=draft, head=HEAD_DIR,
                              schedule=schedule, max_new_tokens=30, do_sample=False, **settings)
        assert torch.equal(out, expected), (inputs["input_ids"], schedule)


def test_online_recalibration_starts_from_the_state_saved_in_the_head_folder(zoo, tmp_path):
    target, draft, tokenizer = zoo
    head_dir = tmp_path / "head"
    shutil.copytree(HEAD_DIR, head_dir)
    # a saved correction that judges every token hopeless: every round stops after its first token
    OnlineAcceptanceEstimator(20, slope=1.0, intercepts=[-30.0] * 20).save(head_dir)
    inputs = tokenizer(PROMPTS[1], return_tensors="pt")
    expected = target.generate(**inputs, max_new_tokens=30, do_sample=False)
    runs = {online: target.generate(**inputs, assistant_model=draft, custom_generate=str(head_dir),
                                    trust_remote_code=True, max_new_tokens=30, do_sample=False, bound=(1, 8),
                                    online=online, return_dict_in_generate=True) for online in (False, True)}
    for out in runs.values():
        assert torch.equal(out.sequences, expected)
    assert max(runs[True].stats.draft_lengths) == 1 < max(runs[False].stats.draft_lengths)
    # the callable form: the estimator passed in is the one that learns, across calls
    estimator = OnlineAcceptanceEstimator.recalibration(8)
    for _ in range(2):
        out = target.generate(**inputs, custom_generate=specdecpp.hf_generate, draft=draft, head=HEAD_DIR, online=True,
                              estimator=estimator, bound=(1, 8), max_new_tokens=30, do_sample=False,
                              return_dict_in_generate=True)
        assert torch.equal(out.sequences, expected)
    assert estimator.steps == 2 * len(out.stats.draft_lengths)


@pytest.mark.parametrize("settings, message", [
    (dict(guidance_scale=1.5), "UnbatchedClassifierFreeGuidanceLogitsProcessor cannot be applied"),
    (dict(num_beams=2), "num_beams"),
    (dict(return_dict_in_generate=True, output_scores=True), "output_scores"),
])
def test_settings_the_loop_cannot_honour_fail_clearly(zoo, settings, message):
    target, draft, tokenizer = zoo
    with pytest.raises(ValueError, match=message):
        folder_generate(target, draft, tokenizer(PROMPTS[0], return_tensors="pt"), max_new_tokens=5, **settings)


def test_every_saved_head_folder_carries_custom_generate(tmp_path):
    AcceptancePredictionHead(16, 1).save_pretrained(tmp_path)
    for name, text in CUSTOM_GENERATE_FILES.items():
        assert (tmp_path / name).read_text() == text
        for committed in ("head", "head-reference"):  # the committed heads are current too
            assert (ZOO_DIR / committed / name).read_text() == text
    assert "specdecpp" in (tmp_path / "custom_generate" / "requirements.txt").read_text().split()
    assert "generate(" in (tmp_path / "README.md").read_text()


def test_speculative_generate_takes_tokenizer_output_and_defaults_to_ada(zoo):
    target, draft, tokenizer = zoo
    inputs = tokenizer(PROMPTS[1], return_tensors="pt")
    assert set(inputs) == {"input_ids", "attention_mask"}
    head = AcceptancePredictionHead.from_pretrained(HEAD_DIR)
    out = speculative_generate(target, draft, **inputs, head=head, max_new_tokens=30, bound=(1, 8))
    ada = speculative_generate(target, draft, inputs["input_ids"], schedule="ada", head=head, max_new_tokens=30,
                               bound=(1, 8))
    assert out.sequences is out["sequences"] and out[0] is out.sequences and out["stats"] is out.stats
    assert torch.equal(out.sequences, target.generate(**inputs, max_new_tokens=30))
    assert out.stats.draft_lengths == ada.stats.draft_lengths
    no_head = speculative_generate(target, draft, **inputs, max_new_tokens=30)
    dynamic = speculative_generate(target, draft, **inputs, schedule="dynamic", max_new_tokens=30)
    assert no_head.stats.draft_lengths == dynamic.stats.draft_lengths


def test_padding_in_the_attention_mask_is_refused(zoo):
    target, draft, tokenizer = zoo
    inputs = tokenizer(PROMPTS[0], return_tensors="pt")
    padded = inputs["attention_mask"].clone()
    padded[0, 0] = 0
    with pytest.raises(ValueError, match="padding"):
        speculative_generate(target, draft, inputs["input_ids"], attention_mask=padded, max_new_tokens=5)
    with pytest.raises(ValueError, match="shape"):
        speculative_generate(target, draft, inputs["input_ids"], attention_mask=padded[:, 1:], max_new_tokens=5)
