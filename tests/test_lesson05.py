"""Lesson 05: gradient identities against brute-force autograd, simplex flows, the bandit's fixed points
against the closed forms, the sequence toy, off-policy weights, the panels and the exercise checks."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("agg")

import pytest
import torch

import klviz
from klviz.bandit import (
    IMPORTANCE_WEIGHTS,
    SequenceToy,
    bandit_fixed_points,
    forward_kl_optimum,
    offpolicy_expected_gradient,
    reverse_kl_optimum,
    reward_updates,
    tv_distance,
)
from klviz.check import lesson05 as check05
from klviz.simplex import (
    ALL_FLOWS,
    CHOICES,
    check_probs,
    descent_paths,
    field_gradient,
    flow_coefficient,
    gradient_error_terms,
    probability_velocity,
    simplex_grid,
    to_xy,
)
from klviz.usage import EstimatorUse

torch.set_default_dtype(torch.float32)
F64 = torch.float64


def _pair(seed: int, v: int = 6, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(v, generator=g, dtype=F64), scale * torch.randn(v, generator=g, dtype=F64)


# ---------------------------------------------------------------- brute force, written independently
def _surrogate_loss(theta: torch.Tensor, x: int, log_ref: torch.Tensor, estimator: str, placement: str) -> torch.Tensor:
    log_pi_x = theta[x] - torch.logsumexp(theta, 0)
    d = log_ref[x] - log_pi_x
    vals = {"k1": -d, "k2": d * d / 2, "k3": torch.exp(d) - 1 - d}
    if estimator == "k3_ratio":
        v = torch.exp(log_pi_x) / torch.exp(log_pi_x).detach() * vals["k3"]
    elif estimator == "k3+":
        v = vals["k3"].detach() + (vals["k2"] - vals["k2"].detach())
    else:
        v = vals[estimator]
    return v if placement == "loss" else v.detach() * log_pi_x


def _brute_expected(theta: torch.Tensor, ref_logits: torch.Tensor, estimator: str, placement: str) -> torch.Tensor:
    log_ref = ref_logits - torch.logsumexp(ref_logits, 0)
    total = torch.zeros(theta.numel(), dtype=F64)
    probs = torch.softmax(theta, 0)
    for x in range(theta.numel()):
        th = theta.detach().clone().requires_grad_(True)
        (g,) = torch.autograd.grad(_surrogate_loss(th, x, log_ref, estimator, placement), th)
        total += float(probs[x]) * g
    return total


def _kl_grad(theta: torch.Tensor, ref_logits: torch.Tensor, forward: bool) -> torch.Tensor:
    th = theta.detach().clone().requires_grad_(True)
    lp, lr = torch.log_softmax(th, 0), torch.log_softmax(ref_logits, 0)
    kl = (lr.exp() * (lr - lp)).sum() if forward else (lp.exp() * (lp - lr)).sum()
    (g,) = torch.autograd.grad(kl, th)
    return g


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_field_gradient_matches_brute_force_autograd(seed):
    th, ref = _pair(seed)
    batch = torch.stack([th, ref, th + 0.3 * ref])
    brute_name = {"none": None, "rho": "k3_ratio", "straight-through": "k3+"}  # the brute force's names
    for flow, use in CHOICES.items():
        est = brute_name[use.weighting] or use.estimator
        field = field_gradient(batch, ref, flow)
        for i in range(3):
            assert torch.allclose(field[i], _brute_expected(batch[i], ref, est, use.placement), atol=1e-12), flow
    assert torch.allclose(field_gradient(th, ref, "reverse KL"), _kl_grad(th, ref, False), atol=1e-12)
    assert torch.allclose(field_gradient(th, ref, "forward KL"), _kl_grad(th, ref, True), atol=1e-12)


def test_gradient_identities_in_the_field():
    th, ref = _pair(7, v=9, scale=1.5)
    rev, fwd = _kl_grad(th, ref, False), _kl_grad(th, ref, True)
    g = {f: field_gradient(th, ref, f) for f in CHOICES}
    assert g["k1 in loss"].abs().max() < 1e-14
    for f in ("k2 in loss", "k1 in reward", "k3·ρ in loss", "k3+ in loss"):
        assert torch.allclose(g[f], rev, atol=1e-12)
    assert torch.allclose(g["k3 in loss"], fwd, atol=1e-12)
    assert torch.allclose(g["k3 in reward"], rev - fwd, atol=1e-12)


def test_flow_coefficient_and_velocity():
    th, ref = _pair(3)
    pi = torch.softmax(th, 0)
    for f in ALL_FLOWS:
        c = flow_coefficient(th, ref, f)
        assert torch.allclose(pi * (c - (pi * c).sum()), field_gradient(th, ref, f), atol=1e-12)
    # velocity = Jacobian of softmax times the step (compare with autograd's Jacobian)
    step = torch.randn(6, generator=torch.Generator().manual_seed(1), dtype=F64)
    jac = torch.autograd.functional.jacobian(lambda t: torch.softmax(t, 0), th)
    assert torch.allclose(probability_velocity(pi, step), jac @ step, atol=1e-12)


def test_gradient_error_terms_against_enumeration():
    th, ref = _pair(4, v=5)
    pi = torch.softmax(th, 0)
    rev = _kl_grad(th, ref, False)
    for f, use in CHOICES.items():
        log_r = torch.log_softmax(ref, 0) - torch.log_softmax(th, 0)
        c = klviz.gradient_coefficient(log_r, use.estimator, use.placement, use.weighting)
        per = c[:, None] * (torch.eye(5, dtype=F64) - pi)  # per-token gradient rows
        mean = pi @ per
        var = float((pi * (per - mean).square().sum(-1)).sum())
        terms = gradient_error_terms(th, ref, f)
        assert terms["variance"] == pytest.approx(var, rel=1e-10, abs=1e-14)
        assert terms["bias_sq"] == pytest.approx(float((mean - rev).square().sum()), rel=1e-10, abs=1e-14)


def test_simplex_geometry_and_validation():
    grid = simplex_grid(10, margin=0.05)
    assert torch.allclose(grid.sum(-1), torch.ones(len(grid), dtype=F64))
    assert (grid >= 0.05 - 1e-12).all()
    xy = to_xy(torch.eye(3, dtype=F64))
    assert torch.allclose(xy, torch.tensor([[0, 0], [1, 0], [0.5, math.sqrt(3) / 2]], dtype=F64))
    with pytest.raises(ValueError, match="probs"):
        to_xy(torch.ones(4))
    with pytest.raises(ValueError, match="start_probs"):
        descent_paths(torch.tensor([0.5, 0.6, -0.1]), torch.tensor([0.3, 0.3, 0.4]), ["k1 in loss"])
    with pytest.raises(ValueError, match="flow"):
        field_gradient(torch.zeros(3), torch.zeros(3), "k4 in loss")
    with pytest.raises(ValueError, match="ref_logits"):
        field_gradient(torch.zeros(3), torch.zeros(4), "k1 in loss")
    with pytest.raises(ValueError, match="lr"):
        descent_paths(torch.tensor([0.3, 0.3, 0.4]), torch.tensor([0.3, 0.3, 0.4]), ["k1 in loss"], lr=-1.0)
    with pytest.raises(ValueError, match="beta"):
        descent_paths(torch.tensor([0.3, 0.3, 0.4]), torch.tensor([0.3, 0.3, 0.4]), ["k1 in loss"], beta=0.0)
    with pytest.raises(ValueError, match="probs"):
        check_probs(torch.tensor([0.2, 0.2]), "probs")


def test_descent_paths_follow_their_fields():
    ref = torch.tensor([0.5, 0.3, 0.2], dtype=F64)
    start = torch.tensor([0.1, 0.1, 0.8], dtype=F64)
    p = descent_paths(
        start, ref, ["k2 in loss", "reverse KL", "k3 in loss", "forward KL", "k1 in loss"], steps=40, lr=0.3
    )
    assert torch.allclose(p["k2 in loss"], p["reverse KL"], atol=1e-12)
    assert torch.allclose(p["k3 in loss"], p["forward KL"], atol=1e-12)
    assert torch.allclose(p["k1 in loss"][-1], start, atol=1e-12)
    # one explicit step by hand
    theta = start.log() - 0.3 * _kl_grad(start.log(), ref.log(), False)
    assert torch.allclose(p["reverse KL"][1], torch.softmax(theta, 0), atol=1e-12)


# ---------------------------------------------------------------- the bandit
def test_closed_form_optima_satisfy_stationarity():
    torch.manual_seed(0)
    ref = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=F64)
    rw = torch.tensor([1.0, -0.5, 0.25, 0.0], dtype=F64)
    for beta in (0.05, 0.3, 1.0, 7.0):
        star = reverse_kl_optimum(ref, rw, beta)
        fwd = forward_kl_optimum(ref, rw, beta)
        # reverse: R - beta log(pi/ref) is constant; forward: R + beta ref/pi is constant
        a = rw - beta * (star / ref).log()
        b = rw + beta * ref / fwd
        assert float(a.max() - a.min()) < 1e-10
        assert float(b.max() - b.min()) < 1e-8
        # brute force: no policy among 20,000 random ones (and none near the solution) does better
        cand = torch.distributions.Dirichlet(torch.ones(4, dtype=F64)).sample((20_000,))
        for forward, sol in ((False, star), (True, fwd)):

            def objective(p, forward=forward, beta=beta):
                kl = (ref * (ref / p).log()).sum(-1) if forward else (p * (p / ref).log()).sum(-1)
                return p @ rw - beta * kl

            best = float(objective(sol))
            assert float(objective(cand).max()) <= best + 1e-12
            near_sol = torch.softmax(sol.log() + 0.05 * torch.randn(2_000, 4, dtype=F64), -1)
            assert float(objective(near_sol).max()) <= best + 1e-12


def test_bandit_fixed_points_match_closed_forms():
    ref = torch.tensor([0.5, 0.3, 0.2], dtype=F64)
    rw = torch.tensor([0.0, 0.5, 1.0], dtype=F64)
    betas = [0.1, 0.5, 2.0]
    fp = bandit_fixed_points(ref, rw, betas, steps=1500)
    for i, b in enumerate(betas):
        star, fwd = reverse_kl_optimum(ref, rw, b), forward_kl_optimum(ref, rw, b)
        for f in ("k2 in loss", "k1 in reward", "k3·ρ in loss", "k3+ in loss", "reverse KL"):
            assert float(tv_distance(fp[f]["policy"][i], star)) < 1e-8
            assert float(fp[f]["grad_norm"][i]) < 1e-8
        assert float(tv_distance(fp["k3 in loss"]["policy"][i], fwd)) < 1e-8
        assert float(fp["k1 in loss"]["policy"][i][2]) > 1 - 1e-6
    with pytest.raises(ValueError, match="betas"):
        bandit_fixed_points(ref, rw, [0.0])
    with pytest.raises(ValueError, match="beta"):
        reverse_kl_optimum(ref, rw, -1.0)
    with pytest.raises(ValueError, match="rewards"):
        forward_kl_optimum(ref, rw[:2], 1.0)


# ---------------------------------------------------------------- sequences
def test_sequence_toy_gradients():
    toy = SequenceToy(2, 3)
    assert toy.sequences.shape == (8, 3) and toy.num_prefixes == 7
    g = torch.Generator().manual_seed(0)
    ref, th = toy.random_logits(generator=g), toy.random_logits(generator=g)
    assert float(toy.sequence_probs(th).sum()) == pytest.approx(1.0)
    true = toy.true_gradient(th, ref)
    # the true gradient written independently: d/dtheta sum_y pi(y) (log pi(y) - log ref(y)) by finite differences
    eps, fd = 1e-6, torch.zeros_like(th)
    for i in range(th.shape[0]):
        for j in range(th.shape[1]):
            d = torch.zeros_like(th)
            d[i, j] = eps
            fd[i, j] = (toy.sequence_kl(th + d, ref) - toy.sequence_kl(th - d, ref)) / (2 * eps)
    assert torch.allclose(true, fd, atol=1e-7)
    assert torch.allclose(toy.expected_gradient(th, ref, "k1 in reward, reward-to-go"), true, atol=1e-12)
    assert torch.allclose(toy.expected_gradient(th, ref, "k1 in reward, whole sequence"), true, atol=1e-12)
    assert toy.expected_gradient(th, ref, "k1 in loss").abs().max() < 1e-12
    part = toy.expected_gradient(th, ref, "k2 in loss")
    assert torch.allclose(part, toy.expected_gradient(th, ref, "k1 in reward, same token"), atol=1e-12)
    assert float((part - true).norm()) > 0.05 * float(true.norm())
    assert toy.gradient_variance(th, ref, "k1 in reward, reward-to-go") < toy.gradient_variance(
        th, ref, "k1 in reward, whole sequence"
    )
    with pytest.raises(ValueError, match="logits"):
        toy.true_gradient(torch.zeros(3, 2), ref)
    with pytest.raises(ValueError, match="method"):
        toy.expected_gradient(th, ref, "k9 in loss")
    with pytest.raises(ValueError, match="vocab_size"):
        SequenceToy(1, 3)


def test_sequence_toy_offpolicy_weights_validate_and_agree():
    toy = SequenceToy(3, 2)
    g = torch.Generator().manual_seed(5)
    ref = toy.random_logits(1.0, generator=g)
    th = ref + toy.random_logits(0.5, generator=g)
    old = th + toy.random_logits(0.5, generator=g)
    with pytest.raises(ValueError, match="weighting"):
        toy.offpolicy_gradient(th, ref, old, "k3", "per token")
    with pytest.raises(ValueError, match="estimator"):
        toy.offpolicy_gradient(th, ref, old, "k4", "none")
    with pytest.raises(ValueError, match="old_logits"):
        toy.offpolicy_gradient(th, ref, old[:2], "k3", "none")
    # on-policy, the prefix product is the full gradient and the per-token ratio the partial one
    assert torch.allclose(toy.offpolicy_gradient(th, ref, th, "k3", "prefix product"), toy.true_gradient(th, ref))
    assert torch.allclose(toy.offpolicy_gradient(th, ref, th, "k3", "per-token ρ"), toy.partial_gradient(th, ref))
    # with old = theta the partial gradient over old's prefixes is the ordinary partial gradient
    assert torch.allclose(toy.partial_gradient(th, ref, prefix_logits=th), toy.partial_gradient(th, ref))


def test_sequence_training_full_gradient_reaches_optimum():
    toy = SequenceToy(2, 2)
    ref = toy.random_logits(generator=torch.Generator().manual_seed(1))
    rw = (toy.sequences == 0).sum(-1).double()
    out = toy.train(ref, ref, rw, 0.5, "k1 in reward, reward-to-go", steps=800, lr=1.0)
    assert float(tv_distance(out["probs"], toy.optimum(ref, rw, 0.5))) < 1e-3
    partial = toy.train(ref, ref, rw, 0.5, "k2 in loss", steps=800, lr=1.0)
    assert float(tv_distance(partial["probs"], toy.optimum(ref, rw, 0.5))) > 1e-3


# ---------------------------------------------------------------- off-policy
def test_offpolicy_weights():
    th, ref = _pair(11, v=7)
    old = th + 0.4 * torch.randn(7, generator=torch.Generator().manual_seed(2), dtype=F64)
    rev = _kl_grad(th, ref, False)
    pi, pi_old = torch.softmax(th, 0), torch.softmax(old, 0)
    # k1 as a loss, unweighted: exactly pi_old - pi_theta = -grad KL(pi_old || pi_theta)
    g = offpolicy_expected_gradient(th, old, ref, "k1 in loss")
    assert torch.allclose(g, pi_old - pi, atol=1e-12)
    # an independent sum with the importance weight pi/pi_old written out
    log_r = torch.log_softmax(ref, 0) - torch.log_softmax(th, 0)
    per = (-log_r)[:, None] * (torch.eye(7, dtype=F64) - pi)
    assert torch.allclose(pi_old @ ((pi / pi_old)[:, None] * per), rev, atol=1e-12)
    for use, imp in (
        ("k3·ρ in loss", "none"),
        ("k1·ρ in loss", "none"),
        ("k2 in loss", "detached"),
        ("k3+ in loss", "detached"),
        ("k1 in reward", "detached"),
        ("k1·ρ in reward", "none"),
    ):
        assert torch.allclose(offpolicy_expected_gradient(th, old, ref, use, imp), rev, atol=1e-12), (use, imp)
    # on-policy, every use and importance weight equals the library's expected gradient
    for est, place in (("k1", "loss"), ("k2", "loss"), ("k3", "loss"), ("k1", "reward"), ("k3", "reward")):
        for w in IMPORTANCE_WEIGHTS:
            assert torch.allclose(
                offpolicy_expected_gradient(th, th, ref, f"{est} in {place}", w),
                klviz.expected_kl_gradient(th, ref, est, place),
                atol=1e-12,
            )
        assert torch.allclose(
            offpolicy_expected_gradient(th, th, ref, EstimatorUse(est, place, "rho")),
            klviz.expected_kl_gradient(th, ref, est, place, "rho"),
            atol=1e-12,
        )
    with pytest.raises(ValueError, match="importance"):
        offpolicy_expected_gradient(th, old, ref, "k1 in loss", "clipped")
    with pytest.raises(ValueError, match="old_logits"):
        offpolicy_expected_gradient(th, old[:3], ref, "k1 in loss")
    with pytest.raises(ValueError, match="weighting"):
        offpolicy_expected_gradient(th, old, ref, "k3+ in reward")
    assert set(IMPORTANCE_WEIGHTS) == {"none", "detached"}
    # the KL reward frozen at rollout (PPO, verl, OpenRLHF): grad KL(pi || ref) - grad KL(pi || pi_old), pi_old fixed
    frozen = offpolicy_expected_gradient(th, old, ref, "k1·ρ in reward", reward_values="rollout")
    assert torch.allclose(frozen, rev - _kl_grad(th, old, False), atol=1e-12)
    k1_old = torch.log_softmax(old, 0) - torch.log_softmax(ref, 0)  # by hand: sum_x pi(x) k1_old(x) s(x)
    assert torch.allclose(frozen, pi @ (k1_old[:, None] * (torch.eye(7, dtype=F64) - pi)), atol=1e-12)
    assert (frozen - rev).norm() > 0.05 * rev.norm()  # biased once pi has moved ...
    assert torch.allclose(
        offpolicy_expected_gradient(th, th, ref, "k1·ρ in reward", reward_values="rollout"),
        _kl_grad(th, ref, False),
        atol=1e-12,
    )  # ... exact on-policy
    detached = offpolicy_expected_gradient(th, old, ref, "k1 in reward", "detached", reward_values="rollout")
    assert torch.allclose(detached, frozen, atol=1e-12)  # a detached weight: the same sum
    with pytest.raises(ValueError, match="reward_values"):
        offpolicy_expected_gradient(th, old, ref, "k3 in loss", reward_values="rollout")
    with pytest.raises(ValueError, match="reward_values"):
        offpolicy_expected_gradient(th, old, ref, "k1 in reward", reward_values="frozen")
    lg = reward_updates(th, torch.arange(7, dtype=F64), steps=3, lr=0.5)
    assert torch.softmax(lg, 0)[6] > pi[6]


# ---------------------------------------------------------------- panels
@pytest.fixture(scope="module")
def flow_panel():
    from klviz.widgets.lesson05 import SimplexFlowPanel

    return SimplexFlowPanel()


@pytest.fixture(scope="module")
def bandit_panel():
    from klviz.widgets.lesson05 import BanditPanel

    return BanditPanel()


def test_flow_panel_defaults_and_extremes(flow_panel):
    assert flow_panel.last_error is None
    for flow in ("k1 in loss", "k3 in reward", "k2 in reward"):
        out = flow_panel.set(flow=flow)
        assert flow_panel.last_error is None, flow
        assert all(math.isfinite(float(v[-1])) for v in out["kl"].values())
    before = flow_panel.readout.value
    flow_panel.set(flow="k3 in loss", start_mat=0.3)
    assert flow_panel.readout.value != before
    for a, b, steps in ((0.01, 0.01, 5), (0.98, 0.01, 400), (0.01, 0.98, 400), (0.495, 0.495, 5)):
        flow_panel.set(start_mat=a, start_sofa=b, steps=steps)
        assert flow_panel.last_error is None, (a, b)
        assert torch.isfinite(torch.as_tensor(flow_panel.last["end"])).all()
    # the controls keep every start inside the triangle: a slider cannot pass the edge, so no setting errs
    for a, b in ((0.9, 0.5), (0.98, 0.98), (0.5, 0.9), (0.98, 0.01), (0.01, 0.98)):
        flow_panel.set(start_mat=a, start_sofa=b)
        v = flow_panel.values()
        assert flow_panel.last_error is None and flow_panel.error.value == "", (a, b)
        assert v["start_mat"] + v["start_sofa"] <= 0.99 + 1e-9, (a, b, v)  # clamped, in the order set
        assert abs(float(flow_panel.last["start"].sum()) - 1) < 1e-12 and flow_panel.last["start"].min() >= 0.01 - 1e-9
    for name, other in (("start_mat", "start_sofa"), ("start_sofa", "start_mat")):  # a reader's drag, one slider
        flow_panel.set(start_mat=0.3, start_sofa=0.3)
        flow_panel.controls[name].value = flow_panel.controls[name].max  # as far as it goes
        assert flow_panel.last_error is None
        assert abs(flow_panel.controls[name].value + flow_panel.controls[other].value - 0.99) < 1e-9
        assert flow_panel.controls[other].max == round(0.99 - flow_panel.controls[name].value, 2)
    with pytest.raises(ValueError, match="keep the sum"):  # compute itself still refuses a point outside
        flow_panel.compute(flow="k3 in loss", start_mat=0.9, start_sofa=0.5, steps=5)
    flow_panel.set(start_mat=0.08, start_sofa=0.12, steps=60)
    assert flow_panel.last_error is None and flow_panel.error.value == ""


def test_flow_panel_sends_its_frame_before_the_other_sliders_maximum(flow_panel):
    """A step of one start slider changes the other's maximum; the page hears of the new frame and
    readout first (the maximum makes the page lay out a slider, which would delay the frame)."""
    flow_panel.set(start_mat=0.08, start_sofa=0.12, steps=60)
    sent: list[str] = []
    sofa = flow_panel.controls["start_sofa"]
    watched = [("sofa", sofa), ("text", flow_panel.text)]
    watched += [("frame", w) for image in flow_panel._stack.images for w in (image, image.layout)]
    for what, w in watched:
        w._send = lambda msg, buffers=None, _what=what: sent.append(_what)
    try:
        flow_panel.controls["start_mat"].value = 0.2
    finally:
        for _, w in watched:
            del w._send
    assert sofa.max == 0.79 and flow_panel.last["start"][0] == pytest.approx(0.2)
    assert "sofa" in sent and "frame" in sent and "text" in sent, sent
    assert sent.index("sofa") > max(sent.index("frame"), sent.index("text")), sent


def test_bandit_panel(bandit_panel):
    from klviz.bandit import BETA_GRID

    assert bandit_panel.last_error is None
    seen = set()
    for beta in (BETA_GRID[0], BETA_GRID[-1], BETA_GRID[5]):
        out = bandit_panel.set(beta=beta)
        assert bandit_panel.last_error is None
        rows = {r["choice"]: r for r in out["rows"]}
        assert rows["k2 in loss"]["tv_to_optimum"] < 1e-8
        assert all(math.isfinite(r["kl"]) for r in out["rows"])
        seen.add(bandit_panel.readout.value)
    assert len(seen) == 3
    for flow in ("k1 in loss", "k3+ in loss"):
        bandit_panel.set(flow=flow)
        assert bandit_panel.last_error is None


# ---------------------------------------------------------------- exercise checks
def test_check_k3_loss_coefficient():
    assert check05.k3_loss_coefficient(lambda lr: -torch.expm1(lr))
    assert not check05.k3_loss_coefficient(lambda lr: ...).attempted
    assert "Sign" in check05.k3_loss_coefficient(lambda lr: torch.expm1(lr)).message
    assert "k1" in check05.k3_loss_coefficient(lambda lr: -lr).message
    assert "inverted" in check05.k3_loss_coefficient(lambda lr: 1 - torch.exp(-lr)).message
    assert "value of k3" in check05.k3_loss_coefficient(lambda lr: torch.expm1(lr) - lr).message


def test_check_bandit_optimum():
    assert check05.bandit_optimum(lambda ref, r, b: torch.softmax(ref.log() + r / b, -1))
    assert not check05.bandit_optimum(lambda ref, r, b: ...).attempted
    assert "Sign" in check05.bandit_optimum(lambda ref, r, b: torch.softmax(ref.log() - r / b, -1)).message
    assert "wrong side" in check05.bandit_optimum(lambda ref, r, b: torch.softmax(ref.log() + r * b, -1)).message
    assert "normalise" in check05.bandit_optimum(lambda ref, r, b: ref * torch.exp(r / b)).message
    assert "dropped" in check05.bandit_optimum(lambda ref, r, b: torch.softmax(r / b, -1)).message


def test_check_reward_to_go():
    assert check05.reward_to_go(lambda k: k.flip(-1).cumsum(-1).flip(-1))
    assert not check05.reward_to_go(lambda k: ...).attempted
    assert "past" in check05.reward_to_go(lambda k: k.cumsum(-1)).message
    assert "partial" in check05.reward_to_go(lambda k: k.clone()).message
    assert "whole-sequence" in check05.reward_to_go(lambda k: k.sum(-1, keepdim=True).expand_as(k)).message
    assert "raised" in check05.reward_to_go(lambda k: 1 / 0).message
