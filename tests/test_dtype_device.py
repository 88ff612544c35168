"""The dtype and device contract: every runtime path, gate, quantizer, mixer and the collaborative layer runs in
float16 and bfloat16 close to the float32 model (dtype-appropriate tolerance) and on the ``meta`` device, which
fails on any tensor created on the CPU inside a forward (what a CUDA user would see). Mechanisms: test_mechanisms*."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny import tiny_inputs, tiny_model

from headwise.collaborative import compress
from headwise.mixing import add_mixers
from headwise.pruning import L0Config, add_l0_gates, apply_masks
from headwise.quantization import QUANTIZERS, AttentionQuantizer, QuantizationConfig, quantize_attention
from headwise.runtime import HardConcreteGate, HeadGate, HeadMask, RowGate, add_gates, add_observer
from headwise.runtime.attention import headwise_attention
from headwise.sites import find_sites

TOLERANCE = {torch.float16: 2e-2, torch.bfloat16: 8e-2}


def _seeded(t: torch.Tensor, seed: int) -> torch.Tensor:
    return torch.rand(t.shape, generator=torch.Generator().manual_seed(seed))


def _gates(model):
    for i, gate in enumerate(add_gates(model).values()):
        gate.weight.data = 0.5 + _seeded(gate.weight, i)


def _masks(model):
    apply_masks(model, {s.name: [1, 0, 1, 1] for s in find_sites(model)})


def _l0(model):
    for i, gate in enumerate(add_l0_gates(model, L0Config(init=0.0)).values()):
        gate.log_alpha.data = 4 * _seeded(gate.log_alpha, i) - 2


def _mixers(model):
    for i, mixer in enumerate(add_mixers(model).values()):
        mixer.alpha.data = torch.eye(mixer.alpha.shape[0]) + 0.3 * _seeded(mixer.alpha, i)


def _observer(model):  # forces the softmax path, where probabilities are materialised
    for s in find_sites(model):
        add_observer(s, "look", lambda probs, keep, out: None)


EDITS = {
    "sdpa-path": lambda m: None,
    "softmax-path": _observer,
    "gate": _gates,
    "mask": _masks,
    "l0-gate": _l0,
    "mixer": _mixers,
    "collaborative": lambda m: compress(m, dk=6),
    **{f"quantize-{name}": (lambda name: lambda m: quantize_attention(m, quantizer=name, bits=8, threshold=1e-3))(name)
       for name in QUANTIZERS},
}
# Data-dependent quantizers (equal-population bins, binarization at the mean) move values across bins when the
# probabilities themselves move by a rounding step: whole-model outputs are not comparable across dtypes, so they
# are compared on identical (rounded) inputs in test_each_quantizer_alone_follows_the_input_dtype.
DATA_DEPENDENT = {f"quantize-{name}" for name, method in QUANTIZERS.items() if method.data_dependent}
# Equal-population bins select the valid values by boolean indexing (torch.nonzero) and count them on the host: a
# data-dependent shape the meta device cannot compute (CUDA can). The meta tests assert exactly that failure, so
# the day they become shape-static this set must shrink.
META_DATA_DEPENDENT_SHAPES = {f"quantize-{name}" for name in QUANTIZERS if name.startswith("uniform_")}
META_FAILURE = r"nonzero|item\(\) cannot be called on meta"
CASES = [(family, edit) for family in ("bert", "llama") for edit in EDITS]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("family, edit", [c for c in CASES if c[1] not in DATA_DEPENDENT])
def test_half_precision_matches_float32(family, edit, dtype):
    model = tiny_model(family)
    EDITS[edit](model)
    inputs, real = tiny_inputs(family)
    with torch.no_grad():
        reference = model(**inputs).last_hidden_state
        low = copy.deepcopy(model).to(dtype)
        out = low(**inputs).last_hidden_state
    assert out.dtype == dtype
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out[real].float(), reference[real], rtol=tol, atol=tol)


@pytest.mark.parametrize("family, edit", CASES)
def test_meta_device(family, edit):
    """The whole model on ``meta`` (transformers' own padding-mask code calls ``.item()``, so no padding mask
    there), then every site's attention with a padding mask on ``meta``."""
    model = tiny_model(family)
    EDITS[edit](model)
    inputs, real = tiny_inputs(family)
    model.to("meta")
    if edit in META_DATA_DEPENDENT_SHAPES:
        with pytest.raises((NotImplementedError, RuntimeError), match=META_FAILURE), torch.no_grad():
            model(input_ids=inputs["input_ids"].to("meta"))
        return
    with torch.no_grad():
        out = model(input_ids=inputs["input_ids"].to("meta")).last_hidden_state
        assert out.device.type == "meta" and out.shape == (*inputs["input_ids"].shape, model.config.hidden_size)
        B, T = real.shape
        mask = real.to("meta")[:, None, None, :].expand(B, 1, T, T)
        for site in find_sites(model):
            if edit == "collaborative":  # the class swap: its own forward scores and calls the runtime
                hidden = torch.randn(B, T, site.hidden_size, device="meta")
                rotary = torch.randn(B, T, site.head_dim, device="meta")  # cos, sin of a rotary model
                extra = {"position_embeddings": (rotary, rotary)} if site.positions == "rotary" else {}
                got = site.module(hidden, attention_mask=mask, **extra)[0]
                assert got.device.type == "meta" and got.shape == (B, T, site.hidden_size)
                continue
            q = torch.randn(B, site.num_heads, T, site.head_dim, device="meta")
            kv = torch.randn(B, site.num_kv_heads, T, site.head_dim, device="meta")
            got, _ = headwise_attention(site.module, q, kv, kv, mask, scaling=site.head_dim ** -0.5)
            assert got.device.type == "meta" and got.shape == (B, T, site.num_heads, site.head_dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("method", list(QUANTIZERS))
def test_each_quantizer_alone_follows_the_input_dtype(method, dtype):
    """Same rounded probabilities in: the op computed in ``dtype`` equals the op on their float32 copy up to the
    output's rounding (no precision lost inside), and it runs on ``meta``."""
    scores = torch.randn(2, 3, 5, 7, generator=torch.Generator().manual_seed(3)) * 3
    probs = scores.softmax(-1).to(dtype)
    keep = torch.ones(2, 1, 5, 7, dtype=torch.bool)
    keep[1, ..., 5:] = False
    probs = probs.masked_fill(~keep, 0)
    op = AttentionQuantizer(**QuantizationConfig(quantizer=method, bits=4, threshold=1e-3).to_dict())
    reference = op(probs.float(), keep)
    got = op(probs, keep)
    assert got.dtype == dtype
    step = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    torch.testing.assert_close(got.float(), reference, rtol=step, atol=step)
    if f"quantize-{method}" in META_DATA_DEPENDENT_SHAPES:
        with pytest.raises((NotImplementedError, RuntimeError), match=META_FAILURE):
            op(probs.to("meta"), keep.to("meta"))
    else:
        assert op(probs.to("meta"), keep.to("meta")).device.type == "meta"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_each_gate_alone_follows_the_input_dtype_and_device(dtype):
    out32 = torch.randn(2, 3, 4, 5, generator=torch.Generator().manual_seed(0))
    l0 = HardConcreteGate(4, init=1.0).eval()
    scale, mask, row = HeadGate(4), HeadMask(4), RowGate(1, 4)
    scale.weight.data = torch.tensor([0.5, 1.5, 0.0, 2.0])
    mask.mask.copy_(torch.tensor([1.0, 0.0, 1.0, 1.0]))
    row.weight = torch.tensor([[[0.0, 1.0, 0.5, 1.0], [1.0, 1.0, 0.0, 1.0]]])
    for gate in (scale, mask, l0, row):
        reference = gate(out32)
        got = gate(out32.to(dtype))
        assert got.dtype == dtype
        tol = TOLERANCE.get(dtype, 1e-6)
        torch.testing.assert_close(got.float(), reference, rtol=tol, atol=tol)
        assert gate.to("meta")(out32.to("meta", dtype)).device.type == "meta"
