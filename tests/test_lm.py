"""klviz.lm: the shipped tiny language model, its three states, rollouts and log-probabilities."""

from __future__ import annotations

import importlib.resources
import time

import pytest
import torch

import klviz
from klviz import lm


@pytest.fixture(scope="module")
def states():
    return {s: lm.load_tiny_lm(s) for s in lm.STATES}


@pytest.fixture(scope="module")
def batch(states):
    return lm.sample_rollouts(states["old"], list(lm.PROMPTS) * 2, klviz.make_generator(0), max_new_tokens=40)


def test_weights_ship_as_package_data_under_5_mb_and_load_with_weights_only():
    data = importlib.resources.files("klviz").joinpath("data")
    names = ["tiny_lm_ref.pt", "tiny_lm_old.pt", "tiny_lm_new.pt", "tiny_lm_path.pt", "tiny_corpus.txt"]
    total = 0
    for name in names:
        ref = data.joinpath(name)
        assert ref.is_file(), name
        total += len(ref.read_bytes())
        if name.endswith(".pt"):
            with ref.open("rb") as fh:
                sd = torch.load(fh, weights_only=True)
            assert isinstance(sd, dict) and sd
    assert total <= 5 * 1024 * 1024


def test_loads_in_under_a_second_without_network(monkeypatch):
    import socket

    def refuse(*_a, **_k):
        raise AssertionError("loading the tiny model tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    t = time.perf_counter()
    models = [lm.load_tiny_lm(s) for s in lm.STATES]
    assert time.perf_counter() - t < 1.0 and len(models) == 3
    assert lm.corpus()[0].endswith(".")


def test_three_states_differ_and_are_frozen(states):
    p = {s: torch.cat([t.flatten() for t in m.state_dict().values()]) for s, m in states.items()}
    assert not torch.equal(p["ref"], p["old"]) and not torch.equal(p["old"], p["new"])
    for m in states.values():
        assert not m.training and not any(q.requires_grad for q in m.parameters())


def test_update_path_runs_from_old_to_new(states):
    path = lm.update_path()
    assert len(path) == lm.num_update_steps() + 1 >= 3
    sd = lambda m: torch.cat([t.flatten() for t in m.state_dict().values()])  # noqa: E731
    assert torch.equal(sd(path[0]), sd(states["old"])) and torch.equal(sd(path[-1]), sd(states["new"]))


def test_encode_decode_round_trip_and_bad_text():
    text = "the cat sat on the happy mat."
    assert lm.decode(lm.encode(text)) == text
    assert lm.decode([lm.BOS_ID] + lm.encode("a dog") + [lm.EOS_ID, lm.PAD_ID], specials=True) == "<bos>a dog<eos><pad>"
    with pytest.raises(ValueError, match="text"):
        lm.encode("Hello!")
    with pytest.raises(ValueError, match="ids"):
        lm.decode([999])


def test_rollout_layout_masks_and_lengths(batch):
    ids, mask = batch.input_ids, batch.response_mask
    assert ids.shape == mask.shape == batch.logprobs.shape
    assert bool((ids[:, 0] == lm.BOS_ID).all())
    for b in range(batch.batch_size):
        sl = batch.response_slice(b)
        expected = torch.zeros(ids.shape[1])
        expected[sl] = 1
        assert torch.equal(mask[b], expected)
        assert lm.decode(ids[b, 1 : 1 + int(batch.prompt_lengths[b])]) == batch.prompts[b]
        resp = ids[b, sl]
        if bool(batch.finished[b]):
            assert int(resp[-1]) == lm.EOS_ID and int((resp == lm.EOS_ID).sum()) == 1
        assert bool((ids[b, sl.stop :] == lm.PAD_ID).all())
    assert bool(((batch.logprobs < 0) | (mask == 0)).all()) and bool((batch.logprobs[mask == 0] == 0).all())
    assert int(batch.response_lengths.min()) < int(batch.response_lengths.max())
    assert len(set(batch.prompt_lengths.tolist())) > 1


def test_same_generator_seed_gives_the_same_batch(states):
    a = lm.sample_rollouts(states["old"], lm.PROMPTS[:4], klviz.make_generator(7), 30)
    b = lm.sample_rollouts(states["old"], lm.PROMPTS[:4], klviz.make_generator(7), 30)
    c = lm.sample_rollouts(states["old"], lm.PROMPTS[:4], klviz.make_generator(8), 30)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.input_ids, c.input_ids)


def test_sampler_logprobs_equal_rescoring_and_full_distributions(states, batch):
    old = states["old"]
    assert torch.allclose(lm.logprobs_of(old, batch), batch.logprobs, atol=1e-5)
    full = lm.next_token_logprobs(old, batch)
    assert full.shape == (*batch.input_ids.shape, len(lm.VOCAB))
    assert torch.allclose(full.logsumexp(-1), torch.zeros(()), atol=1e-5)
    gathered = full.gather(-1, batch.input_ids.unsqueeze(-1)).squeeze(-1) * batch.response_mask
    assert torch.allclose(gathered, batch.logprobs, atol=1e-5)


def test_model_is_causal_right_padding_changes_nothing(states):
    m = states["ref"]
    ids = torch.tensor([[lm.BOS_ID] + lm.encode("the cat sat")])
    padded = torch.cat([ids, torch.full((1, 5), lm.PAD_ID)], 1)
    assert torch.allclose(m(ids), m(padded)[:, : ids.shape[1]], atol=1e-6)


def test_samples_follow_the_model_distribution(states):
    """First response token after one prompt: empirical frequencies within 4 SE of the model's probabilities."""
    m = states["ref"]
    n = 2000
    ro = lm.sample_rollouts(m, ["the cat"] * n, klviz.make_generator(1), max_new_tokens=1)
    first = ro.input_ids[:, 1 + len("the cat")]
    probs = lm.next_token_logprobs(m, ro)[0, 1 + len("the cat")].exp().double()
    freq = torch.bincount(first, minlength=len(lm.VOCAB)).double() / n
    se = torch.sqrt(probs * (1 - probs) / n) + 1e-12
    assert bool(((freq - probs).abs() <= 4 * se + 1e-3).all())


def test_stop_at_eos_false_keeps_sampling_after_eos(states):
    ro = lm.sample_rollouts(states["old"], list(lm.PROMPTS), klviz.make_generator(5), 40, stop_at_eos=False)
    assert bool((ro.response_lengths == 40).all())
    ids = ro.response_layout(ro.input_ids)
    has_eos = (ids == lm.EOS_ID).any(1)
    first = (ids == lm.EOS_ID).int().argmax(1)
    assert bool(has_eos.any()) and bool((first[has_eos] < 39).any())


def test_response_layout_moves_response_tokens_left(batch):
    ids = batch.response_layout(batch.input_ids)
    m = batch.response_layout_mask
    assert ids.shape == m.shape == (batch.batch_size, batch.response_width)
    for b in range(batch.batch_size):
        n = int(batch.response_lengths[b])
        assert torch.equal(ids[b, :n], batch.input_ids[b, batch.response_slice(b)])
        assert int(m[b].sum()) == n
    with pytest.raises(ValueError, match="values"):
        batch.response_layout(torch.zeros(3, 3))


def test_reward_counts_words_and_punishes_unfinished():
    r = lm.reward(["a happy kind dog.", "the sad cat.", "the cat"], finished=[True, True, False])
    assert r.tolist() == [2.0, -1.0, -1.0]
    with pytest.raises(ValueError, match="finished"):
        lm.reward(["a"], finished=[True, False])
    with pytest.raises(ValueError, match="texts"):
        lm.reward("a happy dog")


def test_update_batch_is_reproducible_and_policy_improved_reward(states):
    a, b = lm.update_batch(), lm.update_batch(states["old"])
    assert torch.equal(a.input_ids, b.input_ids) and a.batch_size == len(lm.PROMPTS) * lm.UPDATE_BATCH_REPEATS
    gen = lambda s: lm.sample_rollouts(states[s], list(lm.PROMPTS) * 10, klviz.make_generator(3), 48)  # noqa: E731
    r_ref, r_old = (lm.reward(ro.responses, ro.finished).mean() for ro in (gen("ref"), gen("old")))
    assert r_old > r_ref + 0.3


def test_bad_inputs_raise_value_errors_naming_the_argument(states):
    m = states["old"]
    g = klviz.make_generator(0)
    with pytest.raises(ValueError, match="state"):
        lm.load_tiny_lm("final")
    with pytest.raises(ValueError, match="generator"):
        lm.sample_rollouts(m, ["a dog"], None)
    with pytest.raises(ValueError, match="prompts"):
        lm.sample_rollouts(m, [], g)
    with pytest.raises(ValueError, match="prompts"):
        lm.sample_rollouts(m, "a dog", g)
    with pytest.raises(ValueError, match="max_new_tokens"):
        lm.sample_rollouts(m, ["a dog"], g, max_new_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        lm.sample_rollouts(m, ["a dog"], g, temperature=0.0)
    with pytest.raises(ValueError, match="model"):
        lm.sample_rollouts(torch.nn.Linear(2, 2), ["a dog"], g)
    with pytest.raises(ValueError, match="rollouts"):
        lm.logprobs_of(m, {"input_ids": torch.zeros(1, 2)})


def test_forward_of_a_64_by_48_batch_is_fast(states):
    m = states["ref"]
    ids = torch.randint(3, len(lm.VOCAB), (64, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        m(ids)
        t = time.perf_counter()
        for _ in range(5):
            m(ids)
    assert (time.perf_counter() - t) / 5 < 0.25  # a few ms on an idle core; generous for a shared CI
