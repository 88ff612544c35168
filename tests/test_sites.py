import pytest
import torch
import transformers as tf
from tiny import CAUSAL, FAMILIES, tiny_model

import headwise
from headwise.sites import find_sites, register_adapter, supported_families


def _projection(mod: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return mod(x)


@pytest.mark.parametrize("family", FAMILIES)
def test_sites_describe_every_attention_module(family):
    model = tiny_model(family)
    sites = find_sites(model)
    expected_layers = model.config.num_hidden_layers if family != "distilbert" else model.config.n_layers
    covered = sorted(layer for s in sites for layer in s.layers)
    assert covered == list(range(expected_layers))
    for s in sites:
        assert s.num_heads == 4 and s.head_dim == 8 and s.hidden_size == 32
        assert s.causal == (family in CAUSAL)
        assert s.kind == ("dec-self" if family in CAUSAL else "enc-self")
    kv = {"llama": 2, "mistral": 2, "qwen2": 1}.get(family, 4)
    assert all(s.num_kv_heads == kv for s in sites)
    assert all(s.positions == ("rotary" if family in {"llama", "mistral", "qwen2"} else "absolute") for s in sites)


@pytest.mark.parametrize("family", FAMILIES)
def test_per_head_views_reproduce_projections(family):
    """q/k/v views give each head's slice of the real projection; the o view recombines heads exactly."""
    model = tiny_model(family)
    site = find_sites(model)[0]
    x = torch.randn(2, 5, site.hidden_size)
    with torch.no_grad():
        for proj in (site.q, site.k, site.v):
            full = proj.module(x)  # for GPT-2's fused c_attn this holds q, k and v
            start = proj.offset
            expected = full[..., start : start + proj.heads * proj.head_dim].unflatten(-1, (proj.heads, proj.head_dim))
            bias = proj.bias if proj.bias is not None else 0
            ours = torch.einsum("btd,hkd->bthk", x, proj.weight) + bias
            torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
        z = torch.randn(2, 5, site.num_heads, site.head_dim)
        expected = site.o.module(z.flatten(2))
        ours = torch.einsum("bthk,hok->bto", z, site.o.weight) + (site.o.bias if site.o.bias is not None else 0)
        torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


def test_views_write_through_to_the_model():
    model = tiny_model("gpt2")
    site = find_sites(model)[0]
    with torch.no_grad():
        site.v.weight[2].zero_()
    d = site.head_dim
    assert torch.all(model.h[0].attn.c_attn.weight[:, 2 * 32 + 2 * d : 2 * 32 + 3 * d] == 0)
    assert torch.any(model.h[0].attn.c_attn.weight[:, 2 * 32 + d : 2 * 32 + 2 * d] != 0)


def test_albert_says_its_module_is_shared():
    (site,) = find_sites(tiny_model("albert"))
    assert site.shared and site.layers == (0, 1, 2)
    assert "shared" in site.notes[0]


def test_unsupported_family_error_names_class_families_and_fix():
    model = tf.GPTNeoModel(tf.GPTNeoConfig(hidden_size=32, num_layers=2, num_heads=4, vocab_size=50,
                                           attention_types=[[["global"], 2]]))
    with pytest.raises(headwise.HeadwiseError) as err:
        find_sites(model)
    message = str(err.value)
    assert "GPTNeoModel" in message and "register_adapter" in message
    for family in ("bert", "gpt2", "llama", "vit"):
        assert family in message


def test_register_adapter_adds_a_family():
    model = tf.GPTNeoModel(tf.GPTNeoConfig(hidden_size=32, num_layers=2, num_heads=4, vocab_size=50,
                                           attention_types=[[["global"], 2]]))
    from headwise.sites import families

    def gpt_neo(m):
        sites = []
        for path, mod in m.named_modules():
            if type(mod).__name__ == "GPTNeoSelfAttention":
                sites.append(families._linear_site(m, path, mod, mod.q_proj, mod.k_proj, mod.v_proj, mod.out_proj,
                                                   heads=4, kv_heads=4, head_dim=8, kind="dec-self",
                                                   positions="absolute", causal=True))
        return sites

    register_adapter("gpt_neo", gpt_neo)
    try:
        assert [s.name for s in find_sites(model)] == ["dec-self.0", "dec-self.1"]
        assert "gpt_neo" in supported_families()
    finally:
        from headwise.sites import registry

        registry._ADAPTERS.pop("gpt_neo")


@pytest.mark.parametrize("family", FAMILIES + ["bart", "marian", "t5"])
def test_each_family_layout_names_real_attributes(family):
    """The adapter's layout is what surgery and collaborative conversion use: every name must be on the module."""
    from tiny import tiny_seq2seq

    model = tiny_model(family) if family in FAMILIES else tiny_seq2seq(family)
    for site in find_sites(model):
        layout, module = site.layout, site.module
        assert all(getattr(module, a) == site.num_heads for a in layout.head_counts)
        assert all(getattr(module, a) == site.num_heads * site.head_dim for a in layout.head_sizes)
        projections = [layout.fused_qkv] if layout.fused_qkv else [layout.query, layout.key]
        assert all(isinstance(getattr(module, p), torch.nn.Module) for p in projections)
        assert layout.position_bias == hasattr(module, "compute_bias")


def test_one_lookup_by_name_or_path():
    from headwise.sites import select_sites, site_by_path, site_table

    model = tiny_model("bert")
    sites = find_sites(model)
    table = site_table(sites)
    assert all(table[s.name] is s and table[s.path] is s for s in sites)
    assert site_by_path(model, sites[1].name).path == site_by_path(model, sites[1].path).path == sites[1].path
    assert [s.path for s in select_sites(model, names=[sites[1].name, sites[1].path])] == [sites[1].path]
    with pytest.raises(headwise.HeadwiseError, match="No attention site 'enc-self.99'"):
        site_by_path(model, "enc-self.99")
