"""The published estimators: EVA (paper form) and LARA against dense per-query references written from the
papers' formulas, and gradients of EVA / LARA against finite differences (float64 gradcheck, nothing detached)."""

import pytest
import torch
from mechanism_cases import D, H, qkv

from headwise.mechanisms import build_core


def _eva_paper_reference(q, k, v, keep, window, overlap, landmarks, scale):
    """Per query, from the paper's formula: window keys exactly, every chunk through (k̄_c, β_c); adaptive=mean."""
    t = q.shape[2]
    q, k = q * scale ** 0.5, k * scale ** 0.5
    size = -(-t // landmarks)
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        summaries = []
        for start in range(0, t, size):
            span = [j for j in range(start - overlap, start + size + overlap) if 0 <= j < t and keep[b, j]]
            if not span:
                continue
            qb, kb, vb = q[b][:, span].mean(1), k[b][:, span].mean(1), v[b][:, span]
            omega = (qb + kb) / 2
            w = (torch.einsum("hjd,hd->hj", k[b][:, span], omega) - k[b][:, span].pow(2).sum(-1) / 2).softmax(-1)
            summaries.append((kb, torch.einsum("hj,hjd->hd", w, vb)))
        for i in range(t):
            start = i // window * window
            near = [j for j in range(start - overlap, start + window + overlap) if 0 <= j < t and keep[b, j]]
            scores = torch.cat([torch.einsum("hd,hjd->hj", q[b][:, i], k[b][:, near]),
                                torch.stack([torch.einsum("hd,hd->h", q[b][:, i], kb) for kb, _ in summaries], -1)],
                               dim=-1).softmax(-1)
            values = torch.cat([v[b][:, near], torch.stack([beta for _, beta in summaries], 1)], dim=1)
            out[b, :, i] = torch.einsum("hj,hjd->hd", scores, values)
    return out


def test_eva_paper_matches_the_per_query_formula():
    q, k, v = qkv(13)
    keep = torch.ones(2, 13, dtype=torch.bool)
    keep[1, -3:] = False
    core = build_core("eva-paper", H, D, window=4, overlap=2, num_landmarks=4, adaptive="mean").eval()
    got = core(q, k, v, ~keep)
    ref = _eva_paper_reference(q, k, v, keep, 4, 2, 4, D ** -0.5)
    torch.testing.assert_close(got[0], ref[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(got[1, :, :10], ref[1, :, :10], atol=1e-5, rtol=0)


def _eva_paper_causal_reference(q, k, v, keep, window, overlap, chunk, scale):
    """Causal EVA per query: its block's keys up to itself (and ``overlap`` before the block) exactly, and every
    chunk of ``chunk`` tokens that ends before its block through (k̄_c, β_c); adaptive=mean."""
    t = q.shape[2]
    q, k = q * scale ** 0.5, k * scale ** 0.5
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        for i in range(t):
            start = i // window * window
            near = [j for j in range(start - overlap, i + 1) if 0 <= j and keep[b, j]]
            keys, values = [k[b][:, near]], [v[b][:, near]]
            for c0 in range(0, start, chunk):
                span = [j for j in range(c0, c0 + chunk) if keep[b, j]]
                if span:
                    qb, kb = q[b][:, span].mean(1), k[b][:, span].mean(1)
                    logw = torch.einsum("hjd,hd->hj", k[b][:, span], (qb + kb) / 2) - k[b][:, span].pow(2).sum(-1) / 2
                    keys.append(kb[:, None])
                    values.append(torch.einsum("hj,hjd->hd", logw.softmax(-1), v[b][:, span])[:, None])
            probs = torch.einsum("hd,hjd->hj", q[b][:, i], torch.cat(keys, 1)).softmax(-1)
            out[b, :, i] = torch.einsum("hj,hjd->hd", probs, torch.cat(values, 1))
    return out


@pytest.mark.parametrize("overlap,chunk", [(0, 4), (2, 2)])
def test_causal_eva_paper_matches_the_per_query_formula(overlap, chunk):
    q, k, v = qkv(15)
    keep = torch.ones(2, 15, dtype=torch.bool)
    keep[1, :3] = False  # left padding, as in generation batches
    core = build_core("eva-paper", H, D, window=4, overlap=overlap, chunk_size=chunk, adaptive="mean").eval()
    got = core(q, k, v, ~keep, causal=True)
    ref = _eva_paper_causal_reference(q, k, v, keep, 4, overlap, chunk, D ** -0.5)
    torch.testing.assert_close(got[0], ref[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(got[1, :, 3:], ref[1, :, 3:], atol=1e-5, rtol=0)


def _lara_reference(q, k, v, landmarks, mis, alpha_coeff, scale):
    """LARA in evaluation (ω_c = μ_c), from the paper's multiple-importance-sampling estimator, one query at a time."""
    q, k = q * scale ** 0.5, k * scale ** 0.5
    t, size = q.shape[2], q.shape[2] // landmarks
    qb = q.unflatten(2, (landmarks, size)).mean(3)  # [b, h, C, d]
    mu = qb + k.unflatten(2, (landmarks, size)).mean(3)
    out = torch.zeros_like(q)
    for i in range(t):
        x = q[:, :, i]  # [b, h, d]
        log_xi_k = torch.einsum("bhcd,bhtd->bhct", mu, k) - k.pow(2).sum(-1)[:, :, None] / 2
        beta = torch.einsum("bhct,bhtd->bhcd", log_xi_k.softmax(-1), v)
        # target N(ω; 0, I) ξ(ω, q) Σ_m ξ(ω, k_m) at ω = μ_c, up to constants
        log_p = -mu.pow(2).sum(-1) / 2 + torch.einsum("bhcd,bhd->bhc", mu, x) + torch.logsumexp(log_xi_k, -1)
        log_q = -(mu[:, :, :, None] - mu[:, :, None]).pow(2).sum(-1) / 2  # log N(ω_c; μ_c', I) + const
        own, mix = log_q.diagonal(dim1=-2, dim2=-1), torch.logsumexp(log_q, -1)
        if mis == "bh":
            log_w = log_p - mix
        else:
            tq = torch.einsum("bhcd,bhd->bhc", qb, x).softmax(-1)
            alpha = (own - mix).exp() + alpha_coeff * (tq - tq.mean(-1, keepdim=True))
            log_w = alpha.clamp_min(1e-8).log() + log_p - own
        out[:, :, i] = torch.einsum("bhc,bhcd->bhd", log_w.softmax(-1), beta)
    return out


@pytest.mark.parametrize("mis", ["opt", "bh"])
def test_lara_matches_the_multiple_importance_sampling_formula(mis):
    q, k, v = qkv(12)
    core = build_core("lara", H, D, num_landmarks=4, mis=mis, alpha_coeff=2.0).eval()
    torch.testing.assert_close(core(q, k, v), _lara_reference(q, k, v, 4, mis, 2.0, D ** -0.5), atol=1e-5, rtol=0)


def test_lara_in_evaluation_is_closer_to_softmax_than_a_noisy_draw():
    q, k, v = qkv(64, s=0.8)
    ref = build_core("softmax", H, D)(q, k, v)
    core = build_core("lara", H, D, num_landmarks=8)
    err = lambda out: ((out - ref).norm() / ref.norm()).item()  # noqa: E731
    noisy = sum(err(core.train()(q, k, v)) for _ in range(4)) / 4
    assert err(core.eval()(q, k, v)) < noisy


GRADIENT_CASES = [
    ("eva", {"window": 4, "chunk_size": 2}, False), ("eva", {"window": 4, "chunk_size": 2}, True),
    ("eva", {"window": 4, "chunk_size": 2, "proposal": "key"}, True),
    ("eva-paper", {"window": 3, "overlap": 1, "num_landmarks": 3, "redraw": "fixed"}, False),
    ("eva-paper", {"window": 2, "num_landmarks": 4, "grid": 3, "redraw": "fixed", "adaptive": "no-ln"}, False),
    ("eva-paper", {"window": 4, "chunk_size": 2, "overlap": 1, "redraw": "fixed"}, True),
    ("lara", {"num_landmarks": 3, "redraw": "fixed"}, False),
    ("lara", {"num_landmarks": 3, "redraw": "fixed", "mis": "bh", "proposal": "learned"}, False),
    # FAVOR+ features with per-query and per-head stabilisers (held constant): the estimator's gradient
    ("performer", {"features": 8}, False), ("performer", {"features": 8}, True),
    ("scatterbrain", {"window": 3, "features": 8}, False), ("scatterbrain", {"window": 3, "features": 8}, True),
]


@pytest.mark.parametrize("name,args,causal", GRADIENT_CASES)
def test_gradients_match_finite_differences(name, args, causal):
    """Training mode with a fixed draw: the sampled estimator's exact gradient, including proposal terms."""
    torch.manual_seed(0)
    core = build_core(name, 1, 4, **args).double().train()
    t = 9
    q, k, v = (torch.randn(1, 1, t, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    pad = torch.zeros(1, t, dtype=torch.bool)
    pad[0, -1] = True
    real = ~pad[0]
    assert torch.autograd.gradcheck(lambda a, b, c: core(a, b, c, pad, causal)[:, :, real], (q, k, v),
                                    eps=1e-6, atol=1e-5, rtol=1e-4, fast_mode=True)


def _scatterbrain_reference(core, q, k, v, pad, causal):
    """Dense sparse + low-rank matrix: exact ``exp(s_ij)`` inside the window, the Performer estimate outside."""
    w, t, m = core.config.window, q.shape[2], core.config.features
    omega, scale = core.projection.omega.double(), q.shape[-1] ** -0.5
    q, k, v = q.double(), k.double(), v.double()
    feat = lambda x: (torch.einsum("bhtd,hmd->bhtm", x * scale ** 0.5, omega)  # noqa: E731
                      - x.pow(2).sum(-1, keepdim=True) * scale / 2).exp() / m ** 0.5
    i, j = torch.arange(t)[:, None], torch.arange(t)[None]
    near = (i // w == j // w) if core.config.mode == "block" else (i - j).abs() < w
    weights = torch.where(near, (q @ k.transpose(-1, -2) * scale).exp(), feat(q) @ feat(k).transpose(-1, -2))
    weights = weights * ~pad[:, None, None, :] * ((j <= i) if causal else True)
    return (weights @ v / weights.sum(-1, keepdim=True)).float()


# (mode, window, length): short blocks and windows, whole blocks, and causal blocks of >= CHUNK tokens (per-block
# summaries)
SCATTERBRAIN_SHAPES = [("block", 4, 21), ("sliding", 4, 21), ("block", 4, 20), ("block", 64, 150),
                       ("sliding", 64, 150)]


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "no-mask"])
@pytest.mark.parametrize("mode,window,t", SCATTERBRAIN_SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_scatterbrain_matches_the_dense_sparse_plus_low_rank_matrix(mode, window, t, causal, padded):
    """Exact ``exp(s_ij)`` inside the window, the Performer kernel estimate outside, normalised per row; with a
    padding mask and without one (no mask at all)."""
    q, k, v = qkv(t, s=0.7)
    pad = torch.zeros(2, t, dtype=torch.bool)
    pad[1, -3:] = padded
    core = build_core("scatterbrain", H, D, window=window, features=32, mode=mode).eval()
    ref = _scatterbrain_reference(core, q, k, v, pad, causal)
    got = core(q, k, v, pad if padded else None, causal)
    real = t - 3 if padded else t
    torch.testing.assert_close(got[0], ref[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got[1, :, :real], ref[1, :, :real], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_scatterbrain_long_blocks_in_half_precision_with_padding(causal, dtype):
    """Blocks of 64 over 150 tokens (causal: the per-block summaries): half inputs agree with the float32 run on
    the same rounded inputs, left and right padding."""
    q, k, v = (x * 2.5 for x in qkv(150))
    pad = torch.zeros(2, 150, dtype=torch.bool)
    pad[1, :5] = True
    pad[0, -7:] = True
    core = build_core("scatterbrain", H, D, window=64, features=32).eval()
    ref = core(*(x.to(dtype).float() for x in (q, k, v)), pad, causal)
    got = core.to(dtype)(q.to(dtype), k.to(dtype), v.to(dtype), pad, causal)
    real = ~pad[:, None, :].expand(2, H, 150)
    assert got.dtype == dtype and got[real].float().abs().amax() > 0.05
    assert (got.float() - ref)[real].abs().max().item() < {torch.float16: 1e-2, torch.bfloat16: 6e-2}[dtype]


def test_scatterbrain_long_blocks_decode_and_run_on_meta():
    """Causal blocks of 64: decoding in pieces across block boundaries (and across the one-block exact case)
    equals the full forward; forward and decoding run on ``meta``; padded tokens do not change real outputs."""
    q, k, v = qkv(150)
    pad = torch.zeros(2, 150, dtype=torch.bool)
    pad[1, :5] = True
    core = build_core("scatterbrain", H, D, window=64, features=32).eval()
    full = core(q, k, v, pad, True)
    state, pieces = {}, []
    for a, b in [(0, 1), (1, 63), (63, 65), (65, 128), (128, 129), (129, 150)]:
        pieces.append(core.step(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], ~pad[:, a:b], state, D ** -0.5))
    real = ~pad[:, None, :].expand(2, H, 150)
    torch.testing.assert_close(torch.cat(pieces, 2)[real], full[real], atol=1e-5, rtol=0)
    changed = [x.clone() for x in (q, k, v)]
    for x in changed:
        x[1, :, :5] = 100.0
    torch.testing.assert_close(core(*changed, pad, True)[real], full[real], atol=1e-5, rtol=0)
    meta = core.to("meta")
    out = meta(*(x.to("meta") for x in (q, k, v)), pad.to("meta"), True)
    assert out.device.type == "meta" and out.shape == q.shape
    meta.train()(*(x.to("meta") for x in (q, k, v)), pad.to("meta"), True)
