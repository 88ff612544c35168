"""Randomness as the papers use it: the redraw policy changes features exactly when it says, evaluation is
deterministic, a seed reproduces a run, and bad policies are refused."""

import pytest
import torch
from mechanism_cases import D, H, qkv

from headwise.errors import HeadwiseError
from headwise.mechanisms import build_core

PROJECTED = [("performer", {"features": 8}), ("rfa", {"features": 8}),
             ("scatterbrain", {"window": 3, "features": 8})]
SAMPLED = [("ra", {}), ("lara", {"num_landmarks": 4, "eval_noise": True})]


def _omegas(core, training, calls):
    """``omega`` after each of ``calls`` forwards."""
    core.train(training)
    q, k, v = qkv()
    out = []
    for _ in range(calls):
        core(q, k, v)
        out.append(core.projection.omega.clone())
    return out


def _changes(omegas, first):
    seq = [first, *omegas]
    return [not torch.equal(a, b) for a, b in zip(seq, seq[1:])]


@pytest.mark.parametrize("name,args", PROJECTED)
def test_redraw_policies_change_projected_features_only_when_they_say(name, args):
    for policy, extra, expected in [("fixed", {}, [False] * 4), ("every_step", {}, [True] * 4),
                                    ("every_n_steps", {"redraw_steps": 2}, [False, True, False, True])]:
        core = build_core(name, H, D, redraw=policy, **extra, **args)
        first = core.projection.omega.clone()
        assert _changes(_omegas(core, False, 3), first) == [False] * 3, policy  # evaluation never redraws
        assert _changes(_omegas(core, True, 4), first) == expected, policy


@pytest.mark.parametrize("name,args", PROJECTED)
def test_a_seed_reproduces_the_draws_and_another_seed_differs(name, args):
    a, b, c = (build_core(name, H, D, redraw="every_step", seed=s, **args) for s in (1, 1, 2))
    assert torch.equal(a.projection.omega, b.projection.omega)
    assert not torch.equal(a.projection.omega, c.projection.omega)
    assert all(torch.equal(x, y) for x, y in zip(_omegas(a, True, 3), _omegas(b, True, 3)))


def test_projection_rows_are_orthogonal_gaussian():
    omega = build_core("performer", 1, 16, features=16).projection.omega[0]
    directions = torch.nn.functional.normalize(omega, dim=-1)
    torch.testing.assert_close(directions @ directions.T, torch.eye(16), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name,args", SAMPLED)
def test_sampled_mechanisms_are_deterministic_in_evaluation_and_fresh_in_training(name, args):
    q, k, v = qkv()
    core = build_core(name, H, D, **args)  # default: fresh samples every training step
    core.eval()
    torch.testing.assert_close(core(q, k, v), core(q, k, v), atol=0, rtol=0)
    core.train()
    assert not torch.equal(core(q, k, v), core(q, k, v))
    fixed = build_core(name, H, D, redraw="fixed", **args).train()
    torch.testing.assert_close(fixed(q, k, v), fixed(q, k, v), atol=0, rtol=0)
    again = build_core(name, H, D, **args).train()
    first = build_core(name, H, D, **args).train()
    torch.testing.assert_close(again(q, k, v), first(q, k, v), atol=0, rtol=0)  # same seed, same run


def test_lara_evaluation_uses_the_proposal_means_by_default():
    q, k, v = qkv()
    core = build_core("lara", H, D, num_landmarks=4).eval()
    out = core(q, k, v)
    core.train()
    core(q, k, v)  # a training step draws new noise ...
    torch.testing.assert_close(core.eval()(q, k, v), out, atol=0, rtol=0)  # ... which evaluation does not use


def test_bad_redraw_arguments_are_refused():
    with pytest.raises(HeadwiseError, match="redraw must be one of fixed, every_step, every_n_steps, got 'always'"):
        build_core("performer", H, D, redraw="always")
    with pytest.raises(HeadwiseError, match="redraw_steps must be >= 1, got 0"):
        build_core("rfa", H, D, redraw="every_n_steps", redraw_steps=0)
    with pytest.raises(HeadwiseError, match="learned random features cannot be redrawn"):
        build_core("performer", H, D, learn_features=True, redraw="every_step")


def test_the_current_draw_is_saved_and_reloaded():
    """RA evaluates with the latest training draw; a reloaded state dict gives the same outputs."""
    q, k, v = qkv()
    core = build_core("ra", H, D).train()
    for _ in range(3):
        core(q, k, v)
    out = core.eval()(q, k, v)
    again = build_core("ra", H, D).eval()
    assert not torch.equal(again(q, k, v), out)  # a fresh core is at draw 0
    again.load_state_dict(core.state_dict())
    torch.testing.assert_close(again(q, k, v), out, atol=0, rtol=0)
