"""Half precision and device safety of every mechanism and option: float16 / bfloat16 agree with float32, causal
and not, with padding; everything runs on the ``meta`` device (a CPU tensor made inside a forward would fail)."""

import pytest
import torch
from mechanism_cases import CASES, CAUSAL_CASES, D, H, case_id, length, qkv

from headwise.mechanisms import build_core

# outputs are O(1) weighted means of values; half-precision inputs and parameters round at 2^-11 / 2^-8
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 6e-2}
MODES = [(case, causal) for case in CASES for causal in (False, True) if not causal or case in CAUSAL_CASES]


def _core(name, args, dtype=torch.float32, device="cpu"):
    torch.manual_seed(0)
    return build_core(name, H, D, **args).eval().to(device=device, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case,causal", MODES, ids=lambda x: case_id(x) if isinstance(x, tuple) else f"causal={x}")
def test_half_precision_agrees_with_float32(case, causal, dtype):
    name, args = case
    t = length(name)
    q, k, v = qkv(t)
    q, k = q * 2.5, k * 2.5  # logits of std ~2: exponentials that underflow in half precision if computed there
    pad = torch.zeros(2, t, dtype=torch.bool)
    pad[1, :3] = True
    pad[0, -2:] = True
    ref = _core(name, args)(q, k, v, pad, causal)
    half = _core(name, args, dtype)
    # the half core's parameters are rounded too: compare with float32 run on the same rounded parameters
    ref_rounded = _core(name, args)
    ref_rounded.load_state_dict({n: p.float() for n, p in half.state_dict().items()})
    ref_rounded = ref_rounded(q.to(dtype).float(), k.to(dtype).float(), v.to(dtype).float(), pad, causal)
    got = half(q.to(dtype), k.to(dtype), v.to(dtype), pad, causal)
    assert got.dtype == dtype
    real = ~pad[:, None, :].expand(2, H, t)
    assert torch.isfinite(got[real]).all()
    assert got[real].float().abs().amax() > 0.05  # not the all-zero output half precision used to give
    err = (got.float() - ref_rounded)[real].abs().max().item()
    assert err < TOLERANCE[dtype], err
    # and the same mechanism on rounded inputs stays close to the full float32 answer
    assert (got.float() - ref)[real].abs().max().item() < 4 * TOLERANCE[dtype] + 0.02 * (name in ("ra",))


def test_drawn_projections_stay_float32_in_a_half_model():
    core = _core("performer", {"features": 16})
    omega = core.projection.omega.clone()
    core.to(torch.bfloat16)
    assert core.projection.omega.dtype == torch.float32 and torch.equal(core.projection.omega, omega)
    core.to("meta")
    assert core.projection.omega.device.type == "meta"
    learned = _core("performer", {"features": 16, "learn_features": True}).to(torch.bfloat16)
    assert learned.projection.omega.dtype == torch.bfloat16  # a parameter follows the model


@pytest.mark.parametrize("name,args", [("performer", {"features": 16}), ("scatterbrain", {"window": 3}),
                                       ("eva", {"window": 4, "chunk_size": 2})])
def test_autocast_does_not_pull_features_back_to_half_precision(name, args):
    """Under autocast the core still computes in float32: the same answer as without autocast, bit for bit."""
    q, k, v = (x.mul(2.5).to(torch.bfloat16) for x in qkv())
    core = _core(name, args)
    ref = core(q, k, v, causal=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = core(q, k, v, causal=True)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, ref, atol=0, rtol=0)


@pytest.mark.parametrize("case,causal", MODES, ids=lambda x: case_id(x) if isinstance(x, tuple) else f"causal={x}")
def test_every_mechanism_runs_on_the_meta_device(case, causal):
    name, args = case
    t = length(name)
    core = _core(name, args, device="meta")
    q, k, v = (x.to("meta") for x in qkv(t))
    pad = torch.zeros(2, t, dtype=torch.bool, device="meta")
    core.train()(q, k, v, pad, causal)  # training draws fresh randomness
    out = core.eval()(q, k, v, pad, causal)
    assert out.device.type == "meta" and out.shape == q.shape


@pytest.mark.parametrize("case", CAUSAL_CASES, ids=case_id)
def test_every_causal_mechanism_decodes_on_the_meta_device(case):
    name, args = case
    core = _core(name, args, device="meta")
    q, k, v = (x.to("meta") for x in qkv(9))
    state = {}
    for a, b in [(0, 1), (1, 5), (5, 9)]:
        out = core.step(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], None, state, D ** -0.5)
        assert out.device.type == "meta" and out.shape == (2, H, b - a, D)
