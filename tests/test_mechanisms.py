"""Efficient attention mechanisms: exactness, causality, padding, approximation quality, decoding, bad input."""

import argparse

import pytest
import torch
import torch.nn.functional as F
from mechanism_cases import CAUSAL_CASES, case_id

from headwise.errors import HeadwiseError
from headwise.mechanisms import MECHANISMS, NestedNamespace, add_args, build_attention, build_core, list_mechanisms

H, D = 2, 8
# small settings so that every mechanism approximates (windows and chunks shorter than the sequences)
SMALL = {
    "softmax": {}, "linear": {}, "local": {"window": 3}, "performer": {"features": 16}, "rfa": {"features": 16},
    "nystrom": {"landmarks": 4}, "eva": {"window": 4, "chunk_size": 2}, "scatterbrain": {"window": 3, "features": 16},
    "local2d": {"window": 2, "grid": 4, "prefix_tokens": 1}, "lara": {"num_landmarks": 4}, "ra": {},
    "cosformer": {"max_length": 40}, "eva-paper": {"window": 4, "overlap": 1, "num_landmarks": 5},
}
CAUSAL_ONES = sorted(n for n, c in MECHANISMS.items() if c.can_be_causal)
T2D = 1 + 4 * 5  # local2d: [CLS] + a 5 × 4 grid


def qkv(t=21, b=2, seed=0, s=1.0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, H, t, D, generator=g) * s for _ in range(3)]


def length(name):
    return T2D if name == "local2d" else 21


def test_registry_lists_every_mechanism_with_arguments_and_complexity():
    names = {m["name"]: m for m in list_mechanisms()}
    assert set(SMALL) <= set(names)
    assert {a["name"] for a in names["eva"]["args"]} >= {"window", "num_chunks", "chunk_size"}
    assert names["nystrom"]["causal"] is False and names["eva"]["causal"] is True
    assert all(m["complexity"] for m in names.values())


@pytest.mark.parametrize("name", sorted(SMALL))
def test_standalone_module_runs_forward_and_backward_with_padding(name):
    t = length(name)
    attn = build_attention(name, dim=16, num_heads=2, **SMALL[name])
    x = torch.randn(2, t, 16, requires_grad=True)
    pad = torch.zeros(2, t, dtype=torch.bool)
    pad[1, -3:] = True
    out = attn(x, key_padding_mask=pad)
    assert out.shape == x.shape and torch.isfinite(out).all()
    out[~pad].sum().backward()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name,args", [("local", {"window": 21}), ("eva", {"window": 21}),
                                       ("eva", {"window": 21, "chunk_size": 4}), ("scatterbrain", {"window": 21})])
def test_windows_covering_the_sequence_equal_softmax(name, args, causal):
    q, k, v = qkv()
    pad = torch.zeros(2, 21, dtype=torch.bool)
    pad[1, -4:] = True
    ref = build_core("softmax", H, D)(q, k, v, pad, causal)
    got = build_core(name, H, D, **args)(q, k, v, pad, causal)
    torch.testing.assert_close(got[0], ref[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(got[1, :, :17], ref[1, :, :17], atol=1e-5, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_local_matches_a_dense_banded_softmax(causal):
    q, k, v = qkv()
    i, j = torch.arange(21)[:, None], torch.arange(21)[None]
    band = ((i - j >= 0) & (i - j < 4)) if causal else ((i - j).abs() < 4)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=band)
    torch.testing.assert_close(build_core("local", H, D, window=4)(q, k, v, causal=causal), ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("tokens", [20, 21])  # whole blocks (no mask at all without overlap) and a partial one
@pytest.mark.parametrize("overlap", [0, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_block_local_matches_a_dense_block_mask(causal, overlap, tokens):
    q, k, v = qkv(tokens)
    i, j = torch.arange(tokens)[:, None], torch.arange(tokens)[None]
    start = i // 5 * 5  # blocks of 5 tokens, each seeing `overlap` more on each side
    mask = (j >= start - overlap) & (j < start + 5 + overlap)
    mask = mask & (j <= i) if causal else mask
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    got = build_core("local", H, D, window=5, mode="block", overlap=overlap)(q, k, v, causal=causal)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def test_local2d_matches_a_dense_neighbourhood_mask_and_covers_the_image():
    q, k, v = qkv(T2D)
    y, x = torch.arange(20) // 4, torch.arange(20) % 4
    mask = torch.ones(T2D, T2D, dtype=torch.bool)
    mask[1:, 1:] = ((y[:, None] - y[None]).abs() < 2) & ((x[:, None] - x[None]).abs() < 2)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(build_core("local2d", H, D, **SMALL["local2d"])(q, k, v), ref, atol=1e-5, rtol=0)
    whole = build_core("local2d", H, D, window=5, grid=4, prefix_tokens=1)(q, k, v)
    torch.testing.assert_close(whole, F.scaled_dot_product_attention(q, k, v), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", CAUSAL_ONES)
def test_changing_future_tokens_leaves_past_outputs_unchanged(name):
    q, k, v = qkv()
    core = build_core(name, H, D, **SMALL[name]).eval()  # training would draw fresh samples at every call
    ref = core(q, k, v, causal=True)
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[:, :, 12:] = torch.randn_like(x[:, :, 12:]) * 3
    # exponential features share one per-head stabiliser (a constant that cancels): only rounding may change
    torch.testing.assert_close(core(q2, k2, v2, causal=True)[:, :, :12], ref[:, :, :12], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", sorted(SMALL))
def test_changing_padded_tokens_leaves_real_outputs_unchanged(name, causal):
    if causal and name not in CAUSAL_ONES:
        with pytest.raises(HeadwiseError, match="cannot be causal"):
            build_core(name, H, D, **SMALL[name])(*qkv(length(name)), causal=True)
        return
    t = length(name)
    q, k, v = qkv(t)
    pad = torch.zeros(2, t, dtype=torch.bool)
    pad[1, :3] = True  # left padding (generation batches) ...
    pad[0, -2:] = True  # ... and right padding
    core = build_core(name, H, D, **SMALL[name]).eval()  # evaluation: random mechanisms are deterministic
    ref = core(q, k, v, pad, causal)
    q2, k2, v2 = (x.clone() for x in (q, k, v))
    for x in (q2, k2, v2):
        x[pad[:, None, :].expand(2, H, t)] = 50.0
    got = core(q2, k2, v2, pad, causal)
    real = ~pad[:, None, :].expand(2, H, t)
    assert torch.isfinite(got[real]).all()
    torch.testing.assert_close(got[real], ref[real], atol=1e-5, rtol=0)


# the small configs, and blocks without overlap (the cores' unmasked fast paths when blocks tile the sequence)
NO_MASK = [(n, a) for n, a in sorted(SMALL.items())] + [
    ("eva-paper", {"window": 4, "num_landmarks": 5}), ("local", {"window": 4, "mode": "block"}),
    ("scatterbrain", {"window": 4, "features": 16})]


@pytest.mark.parametrize("tokens", [20, 21])  # whole blocks of 4 and 5 tokens, and partial ones
@pytest.mark.parametrize("name,args,causal", [(n, a, c) for n, a in NO_MASK for c in (False, True)
                                              if not c or n in CAUSAL_ONES], ids=str)
def test_no_mask_equals_a_mask_that_pads_nothing(name, args, causal, tokens):
    """Cores skip mask work when nothing is padded: the result must be that of the masked path."""
    t = T2D if name == "local2d" else tokens
    q, k, v = qkv(t)
    core = build_core(name, H, D, **args).eval()
    masked = core(q, k, v, torch.zeros(2, t, dtype=torch.bool), causal)
    torch.testing.assert_close(core(q, k, v, None, causal), masked, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name,args", [("softmax", {}), ("local", {"window": 3}),
                                       ("local2d", {"window": 2, "grid": 4, "prefix_tokens": 1})])
def test_padded_keys_get_zero_weight(name, args):
    """An exact mechanism on a right-padded sequence gives the outputs of the sequence without the padding."""
    t = length(name)
    q, k, v = qkv(t, b=1)
    pad = torch.zeros(1, t, dtype=torch.bool)
    pad[0, -1] = True
    core = build_core(name, H, D, **args)
    if name == "local2d":  # drop the last grid token by hand: compare with a dense mask instead
        y, x = torch.arange(20) // 4, torch.arange(20) % 4
        mask = torch.ones(t, t, dtype=torch.bool)
        mask[1:, 1:] = ((y[:, None] - y[None]).abs() < 2) & ((x[:, None] - x[None]).abs() < 2)
        ref = F.scaled_dot_product_attention(q[:, :, :-1], k, v, attn_mask=mask[:-1] & ~pad[0])
    else:
        ref = core(q[:, :, :-1], k[:, :, :-1], v[:, :, :-1])
    torch.testing.assert_close(core(q, k, v, pad)[:, :, :-1], ref, atol=1e-5, rtol=0)


def _relative_error(name, m, seed, causal, ref, q, k, v, **args):
    out = build_core(name, H, D, features=m, seed=seed, **args)(q, k, v, causal=causal)
    return ((out - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("causal", [False, True])
def test_performer_error_falls_toward_softmax_as_features_grow(causal):
    q, k, v = qkv(64, s=0.5)  # logits of std ~0.25
    q, k = q * 1.2, k * 1.2
    ref = build_core("softmax", H, D)(q, k, v, causal=causal)
    uniform = v.cumsum(2) / torch.arange(1, 65)[:, None] if causal else v.mean(2, keepdim=True).expand_as(v)
    errors = [sum(_relative_error("performer", m, s, causal, ref, q, k, v) for s in range(3)) / 3
              for m in (8, 32, 128, 512)]
    assert all(a > b for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < 0.35 * errors[0], errors
    assert errors[-1] < 0.6 * ((uniform - ref).norm() / ref.norm()).item(), errors


def test_rfa_error_falls_toward_cosine_softmax_as_features_grow():
    q, k, v = qkv(64)
    tau = 0.5
    ref = build_core("softmax", H, D)(F.normalize(q, dim=-1), F.normalize(k, dim=-1), v, scale=1 / tau)
    errors = [sum(_relative_error("rfa", m, s, False, ref, q, k, v, temperature=tau) for s in range(3)) / 3
              for m in (64, 256, 1024)]
    assert all(a > b for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < 0.15, errors


def test_ra_is_unbiased_its_error_falls_with_samples():
    q, k, v = qkv(48, s=0.8)
    ref = build_core("softmax", H, D)(q, k, v)
    errors = [((build_core("ra", H, D, samples=n)(q, k, v) - ref).norm() / ref.norm()).item() for n in (1, 8, 64)]
    assert errors[0] > errors[1] > errors[2] and errors[2] < 0.4 * errors[0], errors


@pytest.mark.parametrize("case", CAUSAL_CASES, ids=case_id)
def test_incremental_decoding_equals_the_full_forward(case):
    name, args = case
    torch.manual_seed(0)
    attn = build_attention(name, dim=16, num_heads=2, causal=True, **args).eval()
    x = torch.randn(2, 21, 16)
    pad = torch.zeros(2, 21, dtype=torch.bool)
    pad[1, :3] = True
    full = attn(x, key_padding_mask=pad)
    cache = attn.new_cache()
    steps = [attn(x[:, a:b], key_padding_mask=pad[:, a:b], cache=cache) for a, b in
             [(0, 1), (1, 2), (2, 7), (7, 8), (8, 13), (13, 21)]]
    real = ~pad
    torch.testing.assert_close(torch.cat(steps, dim=1)[real], full[real], atol=1e-5, rtol=0)
    assert cache.length == 21


def test_performer_decoding_rescales_its_sums_when_a_larger_key_arrives():
    """A late key far larger than the early ones moves the running stabiliser; outputs still match."""
    core = build_core("performer", H, D, features=16).eval()
    q, k, v = qkv()
    k[:, :, 15:] *= 6
    full = core(q, k, v, causal=True)
    state = {}
    steps = [core.step(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], None, state, D ** -0.5)
             for a, b in [(0, 5), (5, 15), (15, 16), (16, 21)]]
    torch.testing.assert_close(torch.cat(steps, dim=2), full, atol=1e-5, rtol=1e-4)


def test_eva_default_arguments_work_at_any_length():
    attn = build_attention("eva", dim=32, num_heads=4)
    for t in (512, 509, 77, 1):
        assert attn(torch.randn(1, t, 32)).shape == (1, t, 32)


def test_argparse_with_prefix_and_nested_namespace():
    parser = argparse.ArgumentParser()
    parser.add_argument("--attn-name", default="eva")
    add_args(parser, "eva", prefix="encoder-attn", struct_name="attn_args")
    args = parser.parse_args(["--encoder-attn-window", "16", "--encoder-attn-proposal", "uniform"],
                             namespace=NestedNamespace())
    assert args.attn_args.window == 16 and args.attn_args.num_chunks == 64 and args.attn_args.proposal == "uniform"
    attn = build_attention(args.attn_name, dim=16, num_heads=2, **vars(args.attn_args))
    assert attn.core.config.window == 16
    flags = argparse.ArgumentParser()
    add_args(flags, "local", struct_name="a")
    assert flags.parse_args(["--rel-pos-bias", "true"], namespace=NestedNamespace()).a.rel_pos_bias is True


def test_bad_input_gives_clear_errors():
    with pytest.raises(HeadwiseError, match="unknown attention mechanism 'flash'.*available: cosformer, eva"):
        build_attention("flash", dim=16, num_heads=2)
    with pytest.raises(HeadwiseError, match="cannot be causal.*causal mechanisms: cosformer, eva"):
        build_attention("nystrom", dim=16, num_heads=2, causal=True)
    with pytest.raises(HeadwiseError, match="cannot be causal"):
        build_core("local2d", H, D)(*qkv(T2D), causal=True)
    with pytest.raises(HeadwiseError, match=r"2D form \(grid > 0\) cannot be causal; use grid=0"):
        build_core("eva-paper", H, D, window=2, grid=3)(*qkv(9), causal=True)
    with pytest.raises(HeadwiseError, match="chunk_size 3 must divide window 4"):
        build_core("eva-paper", H, D, window=4, chunk_size=3)
    for name, arg in [("local", "window"), ("eva", "window"), ("scatterbrain", "window"), ("local2d", "window"),
                      ("performer", "features"), ("rfa", "features"), ("scatterbrain", "features")]:
        with pytest.raises(HeadwiseError, match=f"{arg} must be >= 1, got 0"):
            build_attention(name, dim=16, num_heads=2, **{arg: 0})
    with pytest.raises(HeadwiseError,
                       match="has no argument.*windw.*arguments are: mode, overlap, rel_pos_bias, window"):
        build_attention("local", dim=16, num_heads=2, windw=3)
    with pytest.raises(HeadwiseError, match="decoding needs a fixed chunk_size"):
        attn = build_attention("eva", dim=16, num_heads=2, causal=True)
        attn(torch.randn(1, 3, 16), cache=attn.new_cache())
    with pytest.raises(HeadwiseError, match="local: mode must be 'sliding' or 'block', got 'blocks'"):
        build_core("local", H, D, mode="blocks")
    with pytest.raises(HeadwiseError, match="overlap applies to mode='block' only"):
        build_core("local", H, D, overlap=2)
    with pytest.raises(HeadwiseError, match="linear: feature_map must be one of elu, relu, dpfp, got 'exp'"):
        build_core("linear", H, D, feature_map="exp")
    with pytest.raises(HeadwiseError, match="cosformer: decoding needs a fixed max_length"):
        attn = build_attention("cosformer", dim=16, num_heads=2, causal=True)
        attn(torch.randn(1, 3, 16), cache=attn.new_cache())
    with pytest.raises(HeadwiseError, match="eva-paper: 20 tokens do not form a 6-wide grid"):
        build_core("eva-paper", H, D, grid=6)(*qkv(20))
    with pytest.raises(HeadwiseError, match="lara: mis must be 'opt' or 'bh'"):
        build_core("lara", H, D, mis="mis-opt")
    with pytest.raises(HeadwiseError, match="needs a causal module"):
        build_attention("local", dim=16, num_heads=2).new_cache()
