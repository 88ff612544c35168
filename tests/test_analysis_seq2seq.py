"""analyze_seq2seq on a tiny Marian: confidence against eager attention maps, gradient importance of the label
loss (every kind, cross-attention included) against central finite differences of a head's output scale, dtypes.
The CLI (``headwise analyze --task translation``) is tested in test_cli_translation.py."""

import pytest
import torch

from headwise.analysis import analyze_seq2seq, gradient_importance
from headwise.errors import HeadwiseError
from headwise.sites import find_sites
from tiny import seq2seq_inputs, tiny_seq2seq


def labelled(inputs: dict) -> dict:
    """The batch with labels: the decoder inputs shifted left (padding → -100)."""
    ids, real = inputs["decoder_input_ids"], inputs["decoder_attention_mask"].bool()
    labels = torch.cat([ids[:, 1:], ids[:, :1]], 1).masked_fill(~torch.cat([real[:, 1:], real[:, :1] & False], 1),
                                                                 -100)
    return {k: v for k, v in inputs.items()} | {"labels": labels}


def label_loss(model, batch):
    out = model(**{k: v for k, v in batch.items() if k != "labels"})
    logits = out.logits.to(torch.promote_types(out.logits.dtype, torch.float32))  # float64 stays float64
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch["labels"].clamp(min=0),
                                            reduction="none")
    real = batch["labels"] != -100
    return (nll * real).sum(1) / real.sum(1).clamp(min=1)


def eager_confidence(inputs, src_real, tgt_real) -> dict[str, torch.Tensor]:
    """Mean over real query rows of the largest weight on a real key, from transformers' eager attention maps."""
    model = tiny_seq2seq("marian", attn="eager")
    with torch.no_grad():
        out = model(**inputs, output_attentions=True)
    maps = {"enc-self": (out.encoder_attentions, src_real, src_real),
            "dec-self": (out.decoder_attentions, tgt_real, tgt_real),
            "dec-enc": (out.cross_attentions, tgt_real, src_real)}
    conf = {}
    for kind, (layers, q, k) in maps.items():
        rows = []
        for a in layers:  # [B, H, Tq, Tk]
            if kind == "dec-self":
                k_ok = k[:, None, None, :] & torch.ones_like(a, dtype=torch.bool).tril()
            else:
                k_ok = k[:, None, None, :].expand_as(a)
            top = a.masked_fill(~k_ok, 0).amax(-1)  # [B, H, Tq]
            rows.append((top * q[:, None]).sum((0, 2)) / q.sum())
        conf[kind] = torch.stack(rows)
    return conf


def test_confidence_matches_eager_maps_for_every_kind():
    inputs, src_real, tgt_real = seq2seq_inputs("marian")
    stats = analyze_seq2seq(tiny_seq2seq("marian"), [inputs])
    expected = eager_confidence(inputs, src_real, tgt_real)
    got = torch.tensor(stats.roles.scores["confidence"])
    kinds = [site["kind"] for site in stats.roles.sites]
    for kind, table in expected.items():
        rows = [r for r, k in enumerate(kinds) if k == kind]
        assert torch.allclose(got[rows].float(), table, atol=1e-5), kind
    assert stats.importance is None
    assert {h["kind"] for h in stats.heads()} == {"enc-self", "dec-self", "dec-enc"} and len(stats.heads()) == 24


def finite_difference_importance(model, batches, eps: float = 1e-4) -> torch.Tensor:
    """Σ_b |∂L_b/∂g_h| / N for every (site, layer) row and head, by scaling head h's slice of the output
    projection's input by (1 ± eps) with a forward pre-hook (batches of one example), rows L2-normalised."""
    sites = find_sites(model)
    table = torch.zeros(len(sites), sites[0].num_heads, dtype=torch.float64)
    for r, site in enumerate(sites):
        d = site.head_dim
        for h in range(site.num_heads):
            for batch in batches:
                losses = []
                for sign in (1, -1):
                    def scale(_m, args, sign=sign):
                        x = args[0].clone()
                        x[..., h * d:(h + 1) * d] *= 1 + sign * eps
                        return (x,)
                    handle = site.o.module.register_forward_pre_hook(scale)
                    with torch.no_grad():
                        losses.append(label_loss(model, batch).sum().double())
                    handle.remove()
                table[r, h] += abs(losses[0] - losses[1]) / (2 * eps)
    table /= len(batches)
    return table / table.norm(dim=1, keepdim=True)


def test_gradient_importance_covers_cross_attention_and_matches_finite_differences():
    model = tiny_seq2seq("marian").double()
    inputs, _, _ = seq2seq_inputs("marian")
    batches = [{k: v[b:b + 1] for k, v in labelled(inputs).items()} for b in range(2)]
    stats = analyze_seq2seq(model, [inputs], loss_fn=label_loss, loss_inputs=batches)
    got = torch.tensor(stats.importance, dtype=torch.float64)
    assert [s["kind"] for s in stats.roles.sites] == ["enc-self"] * 2 + ["dec-self"] * 2 + ["dec-enc"] * 2
    assert torch.allclose(got, finite_difference_importance(model, batches), atol=1e-5)
    # the self-attention rows are what plain gradient_importance gives
    plain = gradient_importance(model, None, loss_fn=label_loss, inputs=batches)
    assert torch.allclose(got[:4], plain, atol=1e-12)
    assert set(stats.rank_agreement()) == {"enc-self", "dec-self", "dec-enc"}


@pytest.mark.parametrize("dtype,atol", [(torch.float16, 2e-2), (torch.bfloat16, 4e-2)])
def test_confidence_and_importance_in_half_precision(dtype, atol):
    inputs, _, _ = seq2seq_inputs("marian")
    batch = labelled(inputs)
    reference = analyze_seq2seq(tiny_seq2seq("marian"), [inputs], loss_fn=label_loss, loss_inputs=[batch])
    got = analyze_seq2seq(tiny_seq2seq("marian").to(dtype), [inputs], loss_fn=label_loss, loss_inputs=[batch])
    conf = torch.tensor(got.roles.scores["confidence"])
    assert torch.allclose(conf, torch.tensor(reference.roles.scores["confidence"]), atol=atol)
    assert torch.allclose(torch.tensor(got.importance), torch.tensor(reference.importance), atol=5 * atol)


def test_refusals():
    inputs, _, _ = seq2seq_inputs("marian")
    with pytest.raises(HeadwiseError, match="needs both loss_fn"):
        analyze_seq2seq(tiny_seq2seq("marian"), [inputs], loss_fn=label_loss)
    from tiny import tiny_model

    with pytest.raises(HeadwiseError, match="needs an encoder-decoder"):
        analyze_seq2seq(tiny_model("bert"), [inputs])
