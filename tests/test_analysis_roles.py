"""Voita's head roles: hand-built attention maps with known answers, then the streaming driver on tiny models."""

import pytest
import torch
from tiny import seq2seq_inputs, tiny_seq2seq

from headwise.analysis.roles import RoleConfig, head_roles, rarest_positions, role_sums, roles_of, scores_of
from headwise.errors import HeadwiseError
from headwise.report import Report
from headwise.report.analysis import add_roles_section
from headwise.runtime import ops_of
from headwise.sites import find_sites


def _one_hot_rows(targets: list[list[int]], tk: int) -> torch.Tensor:
    """``[H, Tq, Tk]`` maps whose row i of head h puts 0.7 on ``targets[h][i]`` and spreads 0.3 over the rest."""
    maps = torch.full((len(targets), len(targets[0]), tk), 0.3 / (tk - 1))
    for h, row in enumerate(targets):
        for i, j in enumerate(row):
            maps[h, i, j] = 0.7
    return maps


def test_positional_heads_at_voitas_threshold():
    T = 10
    prev = [max(i - 1, 0) for i in range(T)]  # row 0 cannot look back: 9 of 10 rows hit (exactly 90%)
    nxt = [min(i + 1, T - 1) for i in range(T)]
    nxt[3] = 3  # 8 of 10 rows hit
    probs = _one_hot_rows([prev, nxt, list(range(T))], T)[None]
    real = torch.ones(1, T, dtype=torch.bool)
    scores = scores_of(role_sums(probs, None, "enc-self", real, real), 3)
    assert scores["prev"] == pytest.approx([0.9, 0.0, 0.0]) and scores["next"] == pytest.approx([0.0, 0.8, 0.0])
    assert roles_of(scores, "enc-self", RoleConfig(), False) == [["positional:prev"], [], []]
    assert roles_of(scores, "enc-self", RoleConfig(positional_threshold=0.8), False)[1] == ["positional:next"]


def test_padding_and_causal_mask_are_respected():
    T = 6
    probs = _one_hot_rows([[max(i - 1, 0) for i in range(T)]], T)[None].repeat(2, 1, 1, 1)
    real = torch.ones(2, T, dtype=torch.bool)
    real[1, 4:] = False  # padded rows must not count, and a padded key must never be the argmax
    probs[1, 0, 2, 5] = 0.9
    probs[1, 0, 5, 4] = 1.0  # a padded row that would hit
    scores = scores_of(role_sums(probs, None, "enc-self", real, real), 1)
    assert scores["prev"] == pytest.approx([(5 + 3) / (6 + 4)])
    keep = torch.ones(T, T, dtype=torch.bool).tril(-2)[None, None]  # a mask hiding the previous token
    assert scores_of(role_sums(probs, keep, "dec-self", real, real), 1)["prev"] == [0.0]


def test_rare_token_head():
    ids = torch.tensor([[5, 7, 9, 7, 2]])  # 2 is EOS (special)
    counts = torch.zeros(12)
    counts[[5, 7, 9, 2]] = torch.tensor([10.0, 20.0, 1.0, 0.0])
    real = torch.ones(1, 5, dtype=torch.bool)
    rarest = rarest_positions(ids, real, counts, special_ids=[2])
    assert rarest.tolist() == [[False, False, True, False, False]]  # EOS is rarer but special
    probs = _one_hot_rows([[2, 2, 2, 2, 1], [0] * 5], 5)[None]
    scores = scores_of(role_sums(probs, None, "enc-self", real, real, rarest), 2)
    assert scores["rare"] == pytest.approx([0.8, 0.0])
    assert roles_of(scores, "enc-self", RoleConfig(), False) == [["rare"], []]
    tied = rarest_positions(torch.tensor([[5, 5, 5]]), torch.ones(1, 3, dtype=torch.bool), counts)
    assert not tied.any()  # no rarest token when all are equally frequent


def test_alignment_heads_given_and_diagonal():
    S, T = 6, 4
    src, tgt = torch.ones(1, S, dtype=torch.bool), torch.ones(1, T, dtype=torch.bool)
    diagonal = [round(i * (S - 1) / (T - 1)) for i in range(T)]  # 0, 2, 3, 5
    probs = _one_hot_rows([diagonal, [0, 0, 0, 0], [0, 1, 5, 0]], S)[None]
    scores = scores_of(role_sums(probs, None, "dec-enc", tgt, src), 3)
    assert scores["alignment"] == pytest.approx([1.0, 0.25, 0.5])  # head 2: rows 1 and 2 fall in the window
    assert scores["prev"] == [None] * 3  # no positional score across sentences
    assert roles_of(scores, "dec-enc", RoleConfig(), False) == [["alignment"], [], ["alignment"]]
    assert roles_of(scores, "dec-enc", RoleConfig(alignment_confidence=0.8), False) == [[], [], []]
    alignment = torch.zeros(1, T, S, dtype=torch.bool)
    for i, j in enumerate([0, 1, 1, 1]):
        alignment[0, i, j] = True
    given = scores_of(role_sums(probs, None, "dec-enc", tgt, src, alignment=alignment), 3)
    assert given["alignment"] == pytest.approx([0.25, 0.25, 0.5])


def test_driver_matches_eager_maps_for_every_kind():
    model = tiny_seq2seq("marian")
    inputs, src, tgt = seq2seq_inputs("marian")
    counts = torch.arange(97, dtype=torch.float64)  # higher id = more frequent
    roles = head_roles(model, [inputs], counts=counts, special_ids=[1])
    assert [s["name"] for s in roles.sites] == ["enc-self.0", "enc-self.1", "dec-self.0", "dec-self.1",
                                                "dec-enc.0", "dec-enc.1"]
    eager = tiny_seq2seq("marian", attn="eager")
    with torch.no_grad():
        out = eager(**inputs, output_attentions=True)
    maps = [*out.encoder_attentions, *out.decoder_attentions, *out.cross_attentions]
    sides = [(src, src)] * 2 + [(tgt, tgt)] * 2 + [(tgt, src)] * 2
    causal = torch.ones(5, 5, dtype=torch.bool).tril()[None, None]
    for r, (probs, (q, k)) in enumerate(zip(maps, sides)):
        kind = roles.sites[r]["kind"]
        keys = inputs["decoder_input_ids"] if kind == "dec-self" else inputs["input_ids"]
        want = scores_of(role_sums(probs, causal if kind == "dec-self" else None, kind, q, k,
                                   rarest_positions(keys, k, counts, [1])), 4)
        for name, values in want.items():
            assert roles.scores[name][r] == pytest.approx(values, abs=1e-6), (r, name)
    assert model.config._attn_implementation == "headwise" and not any(ops_of(s) for s in find_sites(model))


def test_report_section_per_kind(tmp_path):
    model = tiny_seq2seq("t5")
    inputs, _, _ = seq2seq_inputs("t5")
    roles = head_roles(model, [inputs], RoleConfig(positional_threshold=0.3, rare_threshold=0.3))
    report = Report("roles")
    add_roles_section(report, roles.to_dict())
    html = report.render()
    for kind in ("enc-self", "dec-self", "dec-enc"):
        assert f"{kind}" in html
    assert "hw-roles" in html and "diagonal proxy" in html
    with pytest.raises(HeadwiseError, match="alignment"):
        head_roles(model, [inputs, inputs | {"alignment": torch.ones(3, 5, 7, dtype=torch.bool)}])


def test_analyze_points_encoder_decoders_to_the_encoder_and_to_roles():
    from test_analysis_support import random_texts, word_tokenizer

    from headwise.analysis import analyze

    model = tiny_seq2seq("marian")
    with pytest.raises(HeadwiseError, match=r"model.get_encoder\(\).*head_roles"):
        analyze(model, word_tokenizer("bert"), random_texts(2), progress=False)
    stats = analyze(model.get_encoder(), word_tokenizer("bert"), random_texts(3), progress=False, importance=(),
                    examples=0)
    assert [s["name"] for s in stats.to_dict()["sites"]] == ["enc-self.0", "enc-self.1"]


def test_role_metric_drives_dynamic_swaps_in_every_kind():
    from headwise.analysis.roles import role_metric
    from headwise.mixing import DynamicSwap, DynamicSwapConfig

    model = tiny_seq2seq("bart")
    inputs, _, _ = seq2seq_inputs("bart")
    metric = role_metric([inputs])
    roles = head_roles(model, [inputs])
    for kind in ("enc-self", "dec-self", "dec-enc"):
        sites = [s for s in find_sites(model) if s.kind == kind]
        table = metric(model, sites)
        rows = [r for r, s in enumerate(roles.sites) if s["kind"] == kind]
        want = torch.tensor([roles.scores["confidence"][r] for r in rows])
        torch.testing.assert_close(table, want, atol=1e-6, rtol=0)
        DynamicSwap(model, DynamicSwapConfig(kind=kind), metric=metric)  # accepted for every kind
    encoder = [s for s in find_sites(model) if s.kind == "enc-self"]
    with pytest.raises(HeadwiseError, match="not defined"):
        role_metric([inputs], "alignment")(model, encoder)
