"""SPIQA quantizers: level tables (reference-methods §C.5), hand-computed examples, a literal numpy
transliteration of §C.4, the edge cases of §C.8, the op inside models, save/reload, measurement, sweep and CLI."""

import json
import math

import browser
import numpy as np
import pytest
import torch
from tiny import tiny_inputs, tiny_model

import headwise
from headwise.cli import main
from headwise.quantization import (
    QUANTIZERS, AttentionQuantizer, QuantizationConfig, measuring, prune, quantize_attention,
    quantizers_of, remove_quantization, sweep,
)
from headwise.quantization import functional as F
from headwise.report.quantization import write_quantization_report

P = 1e-3
# Every value in [0, 1] a level table can distinguish: a fine linear grid, a fine log grid, exact 0 and 1.
GRID = torch.cat([torch.tensor([0.0, 1.0]), torch.linspace(0, 1, 100_001), torch.logspace(-12, 0, 100_001)])


def levels(method, bits, **opts):
    return sorted(QUANTIZERS[method].fn(GRID, bits, **opts).unique().tolist())


def close(got, want, rel=2e-4):
    assert len(got) == len(want), (got, want)
    assert all(math.isclose(g, w, rel_tol=rel, abs_tol=1e-12) for g, w in zip(got, want)), (got, want)


# ------------------------------------------------------------------------- §C.5 level tables


def test_level_table_log_clamped_midval():
    close(levels("linear_slog_clamped_midval", 2), [0, 0.0031623, 0.031623, 0.31623])
    close(levels("linear_slog_clamped_midval", 3),
          [0, 0.0016379, 0.0043940, 0.011788, 0.031623, 0.084834, 0.22758, 0.61054])
    b4 = levels("linear_slog_clamped_midval", 4)
    assert len(b4) == 16 and b4[0] == 0
    close([b4[1], b4[-1]], [0.0012589, 0.79433])
    q = F.linear_slog_clamped_midval(torch.tensor([2**-1.423, 0.5, 0.999, 1.0, 1e-3, 0.0025, 0.00099]), 3)
    close(q.tolist(), [0.61054] * 4 + [0.0016379] * 2 + [0])


def test_level_tables_other_element_wise_methods():
    close(levels("linear_slog", 3), [0, 0.0026827, 0.0071969, 0.019307, 0.051795, 0.13895, 0.37276, 1])
    close(levels("linear_slinear", 2), [0, 1 / 3, 2 / 3, 1])
    close(levels("linear_slinear_midval", 3), [0, *[(k + 0.5) / 8 for k in range(1, 8)], 1.0625])
    close(levels("linear_slinear_clamped", 2), [0, 0.334, 0.667, 1.0])
    close(levels("linear_slinear_clamped_midval", 2), [0, 0.375625, 0.625375, 0.875125, 1.124875])
    w = 33.219281 / 8
    close(levels("linear_slog_midval", 3), [0, *[2 ** (-33.219281 + (k + 0.5) * w) for k in range(1, 8)], 4.217])


def test_exact_one_reference_and_clamp():
    one = torch.tensor([1.0])
    assert F.linear_slinear_midval(one, 3).item() == 1.0625
    assert F.linear_slinear_midval(one, 3, top_edge="clamp").item() == 0.9375
    assert math.isclose(F.linear_slinear_clamped_midval(one, 2, top_edge="clamp").item(), 0.875125, rel_tol=1e-6)
    assert math.isclose(F.linear_slog_midval(one, 3, top_edge="clamp").item(), 0.2371, rel_tol=1e-3)
    a = torch.tensor([0.0, 0.2, 0.3, 0.5, 1.0])
    for name in ("uniform_slinear_clamped_mean", "uniform_slog_clamped_mean", "uniform_slog_mean"):
        ref, clamp = QUANTIZERS[name].fn(a, 2), QUANTIZERS[name].fn(a, 2, top_edge="clamp")
        assert ref[-1] == 0 and clamp[-1] == clamp.max() > 0
    for name, method in QUANTIZERS.items():  # 0 stays 0 everywhere except uniform_slog_mean (next test)
        if name != "uniform_slog_mean":
            assert method.fn(torch.tensor([0.0, 0.3]), 3)[0] == 0, name


# ------------------------------------------------------------------------- hand-computed examples


def test_uniform_slinear_clamped_mean_by_hand():
    a = torch.tensor([0.0005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 1.0])
    # P = values > 1e-3 (N = 7), R = 3, step = 2: edges 1e-3, P[2] = .03, P[4] = .05, P[6] = 1.0 (M = 3)
    q = F.uniform_slinear_clamped_mean(a, 2)
    v0, v1, v2 = (P + 0.03) / 2, 0.04, 0.525
    close(q.tolist(), [0, v0, v0, v1, v1, v2, v2, 0], rel=1e-6)
    assert F.uniform_slinear_clamped_mean(a, 2, top_edge="clamp")[-1].item() == pytest.approx(v2)
    close(F.uniform_slinear_clamped_mean(a, 2, bin_value="mean").tolist(),
          [0, 0.015, 0.015, 0.035, 0.035, 0.055, 0.055, 0], rel=1e-6)
    # N = 5, R = 3: step 1 and 4 bins: the number of levels exceeds 2^b - 1 (§C.4.8)
    assert len(F.uniform_slinear_clamped_mean(torch.tensor([.1, .2, .3, .4, .5]), 2).unique()) == 4


def test_uniform_slog_clamped_mean_by_hand():
    a = torch.tensor([0.0, 0.0009, *[k / 100 for k in range(1, 9)]])
    # N = 8, K = 4: cuts 0, 4, 6, 7; levels mean(.01-.04), mean(.05, .06), .07; .08 takes the last one
    q = F.uniform_slog_clamped_mean(a, 2)
    close(q.tolist(), [0, 0, *[0.025] * 4, 0.055, 0.055, 0.07, 0.07], rel=1e-6)


def test_uniform_slog_mean_by_hand_maps_zeros_to_lowest_level():
    a = torch.tensor([0.0, 0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    # N = 8, K = 2: cuts 0, 4, 6; levels mean(0, 0, .1, .2) = .075 and mean(.3, .4) = .35
    close(F.uniform_slog_mean(a, 1).tolist(), [0.075] * 4 + [0.35] * 4, rel=1e-6)
    close(F.uniform_slog_mean(a, 1, zeros="keep").tolist(), [0, 0, 0.075, 0.075] + [0.35] * 4, rel=1e-6)
    # when the lowest cut is itself 0, zeros stay 0 (the reference only lifts values below t_1)
    assert F.uniform_slog_mean(torch.tensor([0.0] * 6 + [0.5, 0.5]), 1)[0] == 0


def test_binarization_by_hand():
    a = torch.tensor([[0.5, 0.4995, 0.0005], [0.9, 0.1, 0.0]])
    assert F.binarization(a).tolist() == [[0.25, 0.25, 0], [0.25, 0.25, 0]]
    assert F.binarization(a, scope="row").tolist() == [[0.5, 0.5, 0], [0.5, 0.5, 0]]
    assert F.binarization(a, floor=0.5).tolist() == [[0.5, 0, 0], [0.5, 0, 0]]


def test_prune_is_strict_and_renormalisation_is_optional():
    a = torch.tensor([[0.1, 0.1001, 0.7999, 0.0]])
    assert prune(a, 0.1)[0].tolist() == pytest.approx([0, 0.1001, 0.7999, 0])
    op = AttentionQuantizer(quantizer="none", threshold=0.1, renormalize=True)
    assert op(a[None, None], None).sum().item() == pytest.approx(1.0)
    assert AttentionQuantizer(quantizer="none", threshold=0.1)(a[None, None], None).sum().item() == pytest.approx(0.9)
    assert AttentionQuantizer(quantizer="none", threshold=0.9, renormalize=True)(a[None, None], None).sum() == 0


# ------------------------------------------------------------------------- a literal numpy transliteration


def np_reference(name, a, b):
    """§C.4 written out with bin masks and loops in float64 (independent of the vectorised torch code)."""
    q = np.zeros_like(a)
    if name == "linear_slinear":
        w = 1 / (2**b - 1)
        return np.floor(a / w + 0.5) * w
    if name == "linear_slinear_midval":
        w = 1 / 2**b
        for k in range(1, 2**b + 1):
            q[(a >= k * w) & (a < (k + 1) * w)] = (k + 0.5) * w
        return q
    if name == "linear_slinear_clamped":
        w = (1 - P) / (2**b - 1)
        q = P + np.floor((a - P) / w + 0.5) * w
        q[a <= P + w / 2] = 0
        return q
    if name == "linear_slinear_clamped_midval":
        w = (1 - P) / 2**b
        for k in range(1, 2**b + 1):
            q[(a >= P + k * w) & (a < P + (k + 1) * w)] = P + (k + 0.5) * w
        return q
    with np.errstate(divide="ignore"):
        la = np.log2(a)
    if name == "linear_slog":
        s = np.log2(P) / (2**b - 1)
        q = 2.0 ** (np.floor(la / s + 0.5) * s)
        q[la < np.log2(P) - s] = 0
        return q
    if name == "linear_slog_midval":
        lo = np.log2(1e-10)
        w = -lo / 2**b
        for k in range(1, 2**b + 1):
            q[(la >= lo + k * w) & (la < lo + (k + 1) * w)] = 2 ** (lo + (k + 0.5) * w)
        return q
    if name == "linear_slog_clamped_midval":
        lo = np.log2(P)
        w = -lo / (2**b - 1)
        for k in range(2**b - 1):
            q[(la >= lo + k * w) & (la < lo + (k + 1) * w)] = 2 ** (lo + (k + 0.5) * w)
        q[a >= 2 ** (lo + (2**b - 2) * w)] = 2 ** (lo + (2**b - 1.5) * w)
        return q
    pop = np.sort(a.ravel())
    if name == "uniform_slinear_clamped_mean":
        pop = pop[pop > P]
        step = max(len(pop) // (2**b - 1), 1)
        t = [P] + [pop[m * step] for m in range(1, len(pop)) if m * step < len(pop)]
        if len(t) == 1:  # one bin (b = 1): undefined in the reference; headwise runs it up to the largest value
            t.append(pop[-1])
        for m in range(len(t) - 1):
            q[(a >= t[m]) & (a < t[m + 1])] = (t[m] + t[m + 1]) / 2
        q[(a >= t[-1]) & (a < 1)] = (t[-2] + t[-1]) / 2
        return q
    if name == "uniform_slog_clamped_mean":
        pop = pop[pop > P]
        K = 2**b
        c = [0]
        for i in range(1, K):
            c.append(c[-1] + len(pop) // 2**i)
        t = [P] + [pop[ci] for ci in c[1:]]
        v = []
        for m in range(K - 1):
            seg = pop[c[m] : c[m + 1]]
            v.append(seg.mean() if len(seg) else v[-1])
        for m in range(K - 1):
            q[(a >= t[m]) & (a < t[m + 1])] = v[m]
        q[(a >= t[K - 1]) & (a < 1)] = v[K - 2]
        return q
    if name == "uniform_slog_mean":
        K = 2**b
        c = [0]
        for i in range(1, K + 1):
            c.append(c[-1] + len(pop) // 2**i)
        t = [None] + [pop[ci] for ci in c[1:]]
        v = []
        for m in range(K):
            seg = pop[c[m] : c[m + 1]]
            v.append(seg.mean() if len(seg) else v[-1])
        q[a < t[1]] = v[0]
        for m in range(1, K):
            q[(a > 0) & (a >= t[m]) & (a < t[m + 1])] = v[m]
        q[(a > 0) & (a >= t[K]) & (a < 1)] = v[K - 1]
        return q
    if name == "binarization":
        q[a >= P] = 1 / (a >= P).sum()
        return q
    raise KeyError(name)


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_matches_literal_transliteration_on_attention_like_values(name):
    g = torch.Generator().manual_seed(0)
    a = (torch.randn(2, 3, 9, 9, generator=g) * 3).softmax(-1)
    a[0, 0, 0] = torch.tensor([1.0] + [0.0] * 8)  # exact 0 and 1 are part of real attention maps
    for bits in (1, 2, 3, 5, 8):
        got = QUANTIZERS[name].fn(a, bits).double().numpy()
        want = np_reference(name, a.double().numpy(), bits)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-9, err_msg=f"{name} {bits} bits")


# ------------------------------------------------------------------------- §C.8 edge cases in the op


def _padded(scores, pad, side):
    """``scores [B, H, n, n]`` embedded in ``T = n + pad`` with padding on one side; keep ``[B, 1, T, T]``."""
    b, h, n, _ = scores.shape
    real = slice(0, n) if side == "right" else slice(pad, n + pad)
    keep = torch.zeros(b, 1, n + pad, n + pad, dtype=torch.bool)
    keep[..., real] = True
    big = torch.zeros(b, h, n + pad, n + pad)
    big[:, :, real, real] = scores
    return big.masked_fill(~keep, -1e9).softmax(-1), keep, real


@pytest.mark.parametrize("side", ["right", "left"])
def test_padding_is_zero_and_does_not_move_any_bin(side):
    scores = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1)) * 3
    probs = scores.softmax(-1)
    big, keep, real = _padded(scores, 3, side)
    for name in QUANTIZERS:
        for scope in ("tensor", "example"):
            op = AttentionQuantizer(quantizer=name, bits=3, threshold=0.01, scope=scope)
            out = op(big, keep)
            assert (out.masked_select(~keep) == 0).all(), name
            torch.testing.assert_close(out[:, :, real, real], op(probs, None), rtol=1e-6, atol=1e-7)


def test_scope_example_is_independent_of_the_batch():
    a = (torch.randn(3, 2, 5, 5, generator=torch.Generator().manual_seed(2)) * 2).softmax(-1)
    for name in ("uniform_slinear_clamped_mean", "uniform_slog_clamped_mean", "uniform_slog_mean", "binarization"):
        op = AttentionQuantizer(quantizer=name, bits=2, scope="example")
        assert torch.equal(op(a, None)[1:2], op(a[1:2], None)), name
        tensor_op = AttentionQuantizer(quantizer=name, bits=2)
        assert not torch.equal(tensor_op(a, None)[1:2], tensor_op(a[1:2], None)), name


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_all_equal_rows_stay_equal_and_finite(name):
    for bits in (1, 3, 16):
        for a in (torch.full((2, 2, 4, 4), 0.25), torch.full((1, 1, 3, 8), 1 / 8)):
            out = AttentionQuantizer(quantizer=name, bits=bits)(a, None)
            assert torch.isfinite(out).all() and (out == out[..., :1]).all(), (name, bits)


def test_binarization_row_scope_sums_rows_to_one():
    a = (torch.randn(2, 2, 5, 5, generator=torch.Generator().manual_seed(3)) * 4).softmax(-1)
    out = AttentionQuantizer(quantizer="binarization", scope="row")(a, None)
    torch.testing.assert_close(out.sum(-1), torch.ones(2, 2, 5))


# ------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("options, message", [
    ({"bits": 0}, "bits must be an integer from 1 to 16"), ({"bits": 17}, "from 1 to 16"),
    ({"bits": 2.5}, "integer"), ({"threshold": 1.0}, r"\[0, 1\)"), ({"threshold": -0.1}, r"\[0, 1\)"),
    ({"quantizer": "logx3"}, "valid: linear_slinear, .*binarization, none, or a short name log"),
    ({"floor": 0}, "floor"),
    ({"top_edge": "up"}, "reference, clamp"), ({"quantizer": "uniform_slog_mean", "scope": "row"}, "binarization only"),
])
def test_bad_options_are_clear_errors(options, message):
    with pytest.raises(headwise.HeadwiseError, match=message):
        QuantizationConfig(**options)


def test_cli_bad_input_fails_before_loading_anything(tmp_path, capsys):
    for argv, message in [(["--bit-widths", "0..3"], "from 1 to 16"), (["--bit-widths", "x"], "range such as 1..8"),
                          (["--quantizers", "linear_slog,foo"], "valid: linear_slinear"),
                          (["--threshold", "1"], r"[0, 1)"), (["--thresholds", "0.1,2"], r"[0, 1)")]:
        assert main(["quantize", *argv, "--out", str(tmp_path / "x")]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


# ------------------------------------------------------------------------- inside models


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama", "albert"])
def test_op_in_model_quantizes_the_explicit_probabilities(family):
    model = tiny_model(family)
    inputs, real = tiny_inputs(family)
    with torch.no_grad():
        plain = model(**inputs, output_attentions=True).attentions[0]
        quantize_attention(model, quantizer="linear_slog_clamped_midval", bits=2, threshold=0.05)
        with measuring(model) as measured:
            quantized = model(**inputs, output_attentions=True).attentions
    allowed = torch.tensor(levels("linear_slog_clamped_midval", 2))
    for layer in quantized:
        assert torch.isclose(layer.unique()[:, None], allowed[None]).any(1).all()
    # attention values: real queries, keys they may see (masked keys have probability exactly 0 in softmax)
    valid = (plain > 0) & real[:, None, :, None]
    expected = F.linear_slog_clamped_midval(prune(plain, 0.05), 2)
    torch.testing.assert_close(quantized[0][valid], expected[valid])
    assert (quantized[0][real[:, None, :, None].expand_as(plain) & (plain == 0)] == 0).all()
    zeros = sum(int(((probs == 0) & valid).sum()) for probs in quantized)  # the meter, counted by hand
    assert measured.sparsity == pytest.approx(zeros / (len(quantized) * int(valid.sum())))
    remove_quantization(model)
    assert not quantizers_of(model)


def test_quantized_model_round_trips(tmp_path):
    model = tiny_model("bert")
    inputs, _ = tiny_inputs("bert")
    quantize_attention(model, quantizer="uniform_slog_clamped_mean", bits=3, threshold=0.01, top_edge="clamp")
    with torch.no_grad():
        before = model(**inputs).last_hidden_state
    headwise.save_pretrained(model, tmp_path / "q")
    loaded = headwise.from_pretrained(tmp_path / "q")
    ops = quantizers_of(loaded)
    assert len(ops) == 2 and all(op.config == next(iter(quantizers_of(model).values())).config for op in ops.values())
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).last_hidden_state, before)


def test_sweep_with_a_user_metric_and_its_report(tmp_path):
    model = tiny_model("bert")
    inputs, _ = tiny_inputs("bert")
    with torch.no_grad():
        reference = model(**inputs).last_hidden_state

    def closeness(m):
        with torch.no_grad():
            return -float((m(**inputs).last_hidden_state - reference).pow(2).mean())

    result = sweep(model, metric=closeness, methods=["linear_slog", "binarization"], bits=(1, 8),
                   thresholds=(1e-3, 0.5), tolerance=0.05)
    assert [r["label"] for r in result.rows] == ["prune >0.001", "prune >0.5", "linear_slog 1b", "linear_slog 8b",
                                                 "binarization"]
    assert result.baseline == 0 and not quantizers_of(model)
    by = {r["label"]: r for r in result.rows}
    assert by["prune >0.5"]["sparsity"] > by["prune >0.001"]["sparsity"]
    assert by["linear_slog 1b"]["distinct"] <= 2 and by["binarization"]["distinct"] <= 2
    summary = {s["method"]: s for s in result.summary()}
    assert set(summary) == {"threshold pruning", "linear_slog", "binarization"}
    data = json.loads(json.dumps(result.to_dict()))
    page = write_quantization_report(data, tmp_path)
    assert page.read_text().count("hw-lines") >= 3
    with pytest.raises(headwise.HeadwiseError, match="metric="):
        sweep(model, methods=["linear_slog"], bits=(2,))


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """``headwise quantize`` run once on the packaged MiniLM (24 pairs): (its output folder, argv, what it printed)."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("quantize") / "q"
    argv = ["quantize", "--limit", "24", "--quantizers", "linear_slog_clamped_midval,binarization",
            "--bit-widths", "2..3", "--thresholds", "0.05", "--out", str(out)]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(argv) == 0
    return out, argv, printed.getvalue()


def test_cli_quantize_on_minilm(quantized, capsys):
    out, argv, printed = quantized
    assert "threshold pruning" in printed and "linear_slog_clamped_midval" in printed
    results = json.loads((out / "results.json").read_text())
    assert len(results["rows"]) == 4 and results["baseline"] > 50
    assert all(0 <= r["sparsity"] <= 1 for r in results["rows"])
    assert (out / "report.html").read_text().count('class="hw-fig hw-lines"') >= 3
    assert main(argv) == 2 and "--force" in capsys.readouterr().err


@pytest.mark.browser
def test_cli_quantize_report_renders_in_chromium(quantized):
    out, _, _ = quantized
    page = browser.load(out / "report.html")
    assert page.attribute("data-hw-ready") == "1" and page.attribute("data-hw-errors") is None
    assert page.count_class("hw-lines") >= 3
