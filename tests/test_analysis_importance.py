"""Gradient importance against autograd through the eager model and finite differences; the batched ablation
sweep against one run per head."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headwise.analysis import ablation_importance, analyze, gradient_importance
from headwise.analysis.rows import rows_of
from headwise.errors import HeadwiseError
from headwise.runtime import add_gates, detach
from headwise.sites import Selection, find_sites
from test_analysis_support import loud_model, padded, pooled_unit, random_texts, run_eager, site_calls, word_tokenizer

TEXTS = random_texts(5, seed=7)


def _rows(model) -> int:
    return sum(n for _, _, n in site_calls(model))


def _probe(i: int, dim: int, seed: int = 0) -> torch.Tensor:
    """The documented default objective: L_i = r_i · unit pooled embedding, r_i seeded by (seed, index)."""
    return torch.randn(dim, generator=torch.Generator().manual_seed(seed * 1_000_003 + i))


def _reference_gradient(family, tokenizer, groups, loss, dtype=torch.float32):
    """Σ over groups of |∂(Σ_b loss_b)/∂g| via autograd through the eager model (gates as pre-hooks on W^O)."""
    model = loud_model(family, attn="eager").to(dtype)
    total = torch.zeros(_rows(model), 4, dtype=torch.float64)
    for group in groups:
        gate = torch.ones(_rows(model), 1, 4, dtype=dtype, requires_grad=True)
        losses = loss(model, group, gate)
        (grad,) = torch.autograd.grad(losses.sum(), gate)
        total += grad.abs().sum(1).double()
    return total


def _projection_loss(tokenizer):
    def loss(model, group, gate):
        inputs, _, _ = padded(tokenizer, [TEXTS[i] for i in group])
        out, _, _ = run_eager(model, inputs, gate, grad=True)
        emb = pooled_unit(out, inputs["attention_mask"])
        return (emb * torch.stack([_probe(i, emb.shape[-1]) for i in group]).to(emb.dtype)).sum(-1)
    return loss


@pytest.mark.parametrize("family", ["bert", "gpt2", "albert"])
def test_gradient_per_example_matches_eager_autograd(family):
    tokenizer = word_tokenizer(family)
    ours = gradient_importance(loud_model(family), tokenizer, TEXTS, abs_scope="example", normalize=False,
                               batch_size=3, progress=False)
    ref = _reference_gradient(family, tokenizer, [[i] for i in range(len(TEXTS))], _projection_loss(tokenizer))
    np.testing.assert_allclose(ours.numpy(), ref.numpy() / len(TEXTS), rtol=1e-4, atol=1e-7)
    if family == "albert":  # one shared module, three rows that really differ
        assert ours.shape == (3, 4) and not torch.allclose(ours[0], ours[1])


def test_gradient_batch_scope_and_normalisation():
    tokenizer = word_tokenizer("bert")
    model = loud_model("bert")
    ours = gradient_importance(model, tokenizer, TEXTS, batch_size=len(TEXTS), abs_scope="batch", normalize=False,
                               progress=False)
    ref = _reference_gradient("bert", tokenizer, [list(range(len(TEXTS)))], _projection_loss(tokenizer))
    np.testing.assert_allclose(ours.numpy(), ref.numpy() / len(TEXTS), rtol=1e-4, atol=1e-7)
    normed = gradient_importance(model, tokenizer, TEXTS, batch_size=len(TEXTS), abs_scope="batch", progress=False)
    torch.testing.assert_close(normed, ours / ours.norm(dim=1, keepdim=True))
    one = gradient_importance(model, tokenizer, TEXTS, batch_size=1, abs_scope="batch", normalize=False, progress=False)
    per_example = gradient_importance(model, tokenizer, TEXTS, abs_scope="example", normalize=False, progress=False)
    torch.testing.assert_close(one, per_example, rtol=1e-5, atol=1e-8)  # the scopes agree at batch size 1
    assert (per_example >= ours - 1e-9).all()  # |Σ g| ≤ Σ |g|


def test_gradient_matches_finite_differences():
    """Central differences in float64 through the eager model, on a few gates."""
    tokenizer = word_tokenizer("gpt2")
    model = loud_model("gpt2").double()
    ours = gradient_importance(model, tokenizer, TEXTS, batch_size=len(TEXTS), abs_scope="batch", normalize=False,
                               progress=False)
    eager = loud_model("gpt2", attn="eager").double()
    inputs, _, _ = padded(tokenizer, TEXTS)
    probes = torch.stack([_probe(i, 32) for i in range(len(TEXTS))]).double()

    def loss(gate):
        out, _, _ = run_eager(eager, inputs, gate)
        return (pooled_unit(out, inputs["attention_mask"]) * probes).sum().item()

    eps = 1e-5
    for row, head in [(0, 0), (0, 3), (1, 2)]:
        up, down = torch.ones(2, 1, 4, dtype=torch.float64), torch.ones(2, 1, 4, dtype=torch.float64)
        up[row, 0, head] += eps
        down[row, 0, head] -= eps
        fd = abs(loss(up) - loss(down)) / (2 * eps) / len(TEXTS)
        assert ours[row, head].item() == pytest.approx(fd, rel=1e-4, abs=1e-9)


def test_gradient_with_sts_pairs_and_custom_loss():
    tokenizer = word_tokenizer("bert")
    first, second = TEXTS, random_texts(5, seed=8)
    scores = [0.0, 1.5, 2.5, 4.0, 5.0]
    ours = gradient_importance(loud_model("bert"), tokenizer, pairs=(first, second, scores), abs_scope="example",
                               normalize=False, batch_size=2, progress=False)

    def sts(model, group, gate):
        (i,) = group
        a, _, _ = padded(tokenizer, [first[i]])
        b, _, _ = padded(tokenizer, [second[i]])
        u = pooled_unit(run_eager(model, a, gate, grad=True)[0], a["attention_mask"])
        v = pooled_unit(run_eager(model, b, gate, grad=True)[0], b["attention_mask"])
        return ((u * v).sum(-1) - scores[i] / 5) ** 2

    ref = _reference_gradient("bert", tokenizer, [[i] for i in range(5)], sts)
    np.testing.assert_allclose(ours.numpy(), ref.numpy() / 5, rtol=1e-4, atol=1e-7)

    # A custom loss with a real gradient: the first token's state on a fixed random direction, squared (a plain sum
    # right after a LayerNorm has a true gradient ~0, and would compare float noise).
    direction = torch.randn(loud_model("bert").config.hidden_size, generator=torch.Generator().manual_seed(11))

    def first_token(model, inputs):
        return (model(**inputs).last_hidden_state[:, 0] @ direction) ** 2

    ours = gradient_importance(loud_model("bert"), tokenizer, TEXTS, loss_fn=first_token, abs_scope="example",
                               normalize=False, progress=False)

    def first_token_ref(model, group, gate):
        inputs, _, _ = padded(tokenizer, [TEXTS[i] for i in group])
        return (run_eager(model, inputs, gate, grad=True)[0].last_hidden_state[:, 0] @ direction) ** 2

    ref = _reference_gradient("bert", tokenizer, [[i] for i in range(5)], first_token_ref)
    assert ref.min() > 1e-3 * ref.max() > 0  # every head has a gradient well above float noise
    np.testing.assert_allclose(ours.numpy(), ref.numpy() / 5, rtol=1e-4, atol=1e-7)


@torch.no_grad()
def _embeddings(model, tokenizer, texts):
    """Unit pooled embeddings, one sentence per forward (no padding)."""
    rows = []
    for text in texts:
        inputs, _, _ = padded(tokenizer, [text])
        rows.append(pooled_unit(model(**inputs), inputs["attention_mask"])[0])
    return torch.stack(rows)


@pytest.mark.parametrize("method", ["layers", "batched", "exact"])
@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_ablation_sweep_equals_one_run_per_head_gate(family, method):
    """Every sweep (layer by layer from the cached output of the layer below, mixed batches, one head per
    forward) equals one unbatched run per head with a plain gate."""
    tokenizer, model = word_tokenizer(family), loud_model(family)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ours = ablation_importance(model, tokenizer, TEXTS, batch_size=3, sweep_batch=7, progress=False,  # 2 copies
                               method=method)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert not any("forward" in vars(m) for m in model.modules())  # every block runs its own forward again
    base = _embeddings(model, tokenizer, TEXTS)
    ref = torch.zeros(2, 4, dtype=torch.float64)
    for r, site in enumerate(find_sites(model)):
        gate = add_gates(model, name="reference", selection=Selection(names=[site.name]))[site.path]
        for h in range(4):
            with torch.no_grad():
                gate.weight.fill_(1.0)
                gate.weight[h] = 0.0
            ref[r, h] = (1 - (_embeddings(model, tokenizer, TEXTS) * base).sum(-1)).mean()
        detach(site, "reference")
    np.testing.assert_allclose(ours.numpy(), ref.numpy(), atol=1e-5, rtol=0)
    assert (ours > 1e-4).all()


def test_the_layer_sweep_skips_the_layers_below_and_refuses_unknown_methods():
    from headwise.analysis.importance import ablation_sums
    from headwise.analysis.layer_stack import block_stack

    tokenizer, model = word_tokenizer("llama"), loud_model("llama")
    stack, blocks = block_stack(model, rows_of(model))
    assert stack is model.layers and blocks == [0, 1]
    calls = []
    handles = [s.module.register_forward_pre_hook(lambda m, a, k, i=i: calls.append(i), with_kwargs=True)
               for i, s in enumerate(find_sites(model))]  # the attention of the layers that really run
    ablation_sums(model, tokenizer, TEXTS[:3], batch_size=3, sweep_batch=12, progress=False)  # a layer per forward
    for h in handles:
        h.remove()
    assert calls == [0, 1, 0, 1, 1]  # reference; layer 0's heads (both layers); layer 1's heads (layer 1 only)
    with pytest.raises(HeadwiseError, match="ablation method"):
        ablation_sums(model, tokenizer, TEXTS, method="fast")


def test_ablation_per_layer_of_a_shared_module_and_metric_callable():
    tokenizer, model = word_tokenizer("albert"), loud_model("albert")
    ours = ablation_importance(model, tokenizer, TEXTS, batch_size=2, sweep_batch=5, progress=False)
    eager = loud_model("albert", attn="eager")
    inputs, _, _ = padded(tokenizer, TEXTS)
    base = pooled_unit(run_eager(eager, inputs)[0], inputs["attention_mask"])
    ref = torch.zeros(3, 4, dtype=torch.float64)
    for r in range(3):
        for h in range(4):
            gate = torch.ones(3, 1, 4)
            gate[r, 0, h] = 0
            emb = pooled_unit(run_eager(eager, inputs, gate)[0], inputs["attention_mask"])
            ref[r, h] = (1 - (emb * base).sum(-1)).mean()
    np.testing.assert_allclose(ours.numpy(), ref.numpy(), atol=1e-5, rtol=0)

    def fidelity(m):
        inputs2, _, _ = padded(tokenizer, TEXTS)
        return (pooled_unit(m(**inputs2), inputs2["attention_mask"]) * base).sum(-1).mean().item()

    by_metric = ablation_importance(model, metric=fidelity, progress=False)
    np.testing.assert_allclose(by_metric.numpy(), ref.numpy(), atol=1e-5, rtol=0)


@pytest.mark.slow
def test_packaged_minilm_end_to_end(minilm):
    model, tokenizer = minilm
    texts = ["A man is playing a guitar.", "The cat sits on the mat.", "Stocks fell sharply on Monday.",
             "She is reading a book in the park."]
    stats = analyze(model, tokenizer, texts, batch_size=2, examples=1, abs_scope="example", progress=False)
    doc = stats.to_dict()
    assert doc["sentences"] == 4 and len(doc["sites"]) == 6
    for name, table in doc["heads"].items():
        assert np.isfinite(np.array(table, dtype=float)).all() and np.array(table).shape == (6, 12), name
    assert doc["examples"][0]["tokens"][0] == "[CLS]"
    special = np.array(doc["heads"]["special"])
    assert special.max() > 0.3  # some MiniLM heads park their attention on [CLS]/[SEP]
    grad = np.array(doc["heads"]["importance_gradient"]).ravel()
    abl = np.array(doc["heads"]["importance_ablation"]).ravel()
    rank = lambda x: np.argsort(np.argsort(x))  # noqa: E731
    assert np.corrcoef(rank(grad), rank(abl))[0, 1] > 0.3  # first-order estimate tracks the real drop


def test_gradient_importance_freezes_every_weight_and_leaves_no_gradient():
    tokenizer, model = word_tokenizer("llama"), loud_model("llama")
    seen = []

    def loss(m, batch):
        seen.append([p.requires_grad for p in m.parameters()])
        return m(**batch).last_hidden_state.pow(2).mean((1, 2))

    table = gradient_importance(model, tokenizer, TEXTS, loss_fn=loss, batch_size=2, progress=False)
    assert seen and not any(any(flags) for flags in seen)  # frozen during the pass
    assert (table > 0).all()  # every gate still gets its gradient
    assert all(p.requires_grad and p.grad is None for p in model.parameters())  # restored, nothing accumulated


def _tiny_causal_lm():
    import transformers as tf

    from test_analysis_support import VOCAB

    torch.manual_seed(3)
    config = tf.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=37, vocab_size=VOCAB, max_position_embeddings=64)
    return tf.AutoModelForCausalLM.from_config(config, attn_implementation="headwise").eval()


@pytest.mark.parametrize("recompute", [False, True], ids=["kept", "recomputed"])
@pytest.mark.parametrize("kind", ["bert", "llama", "causal-lm"])
def test_statistics_and_gradient_in_one_pass_equal_two_passes(kind, recompute):
    """analyze runs the gradient over the analysed texts in the statistics pass: the same statistics as a pass
    without importance, the same importance as gradient_importance alone (which is checked against eager
    autograd above); for a language model, of its next-token loss on the texts. With the blocks recomputed in
    the backward, the observers see each forward once (the recomputation is not counted)."""
    from headwise.tasks import LanguageModeling

    family = "llama" if kind == "causal-lm" else kind
    tokenizer = word_tokenizer(family)
    model = _tiny_causal_lm() if kind == "causal-lm" else loud_model(family)
    loss = LanguageModeling().loss if kind == "causal-lm" else None
    texts = random_texts(7, seed=3)
    one = analyze(model, tokenizer, texts, importance=("gradient",), examples=0, batch_size=3, loss_fn=loss,
                  progress=False, recompute=recompute)
    assert set(one.seconds) == {"observe", "gradient (blocks recomputed)" if recompute else "gradient"}
    alone = analyze(model, tokenizer, texts, importance=(), examples=0, batch_size=3, progress=False).to_dict()
    got = one.to_dict()
    assert got["sentences"] == alone["sentences"] == 7 and got["tokens"] == alone["tokens"]
    tables = [("heads", alone["heads"]), ("similarity", alone["similarity"]),
              ("histogram", {"counts": alone["histogram"]["counts"]})]
    for part, named in tables:
        for name, table in named.items():
            assert np.allclose(np.array(got[part][name], dtype=float), np.array(table, dtype=float), rtol=1e-5,
                               atol=1e-6, equal_nan=True), (part, name)
    reference = gradient_importance(model, tokenizer, texts, loss_fn=loss, batch_size=3, progress=False)
    ours = np.array(got["heads"]["importance_gradient"], dtype=float)
    assert np.allclose(ours, reference.numpy(), rtol=1e-4, atol=1e-6, equal_nan=True)
    assert np.nanmin(ours) > 0


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_checkpointed_blocks_give_the_same_gradient_and_leave_the_model_as_it_was(family):
    from headwise.analysis.importance import gradient_sums

    tokenizer, model = word_tokenizer(family), loud_model(family)
    model.config.use_cache = True
    flags = [i % 3 != 0 for i, _ in enumerate(model.parameters())]  # a mix of trainable and frozen weights
    for p, flag in zip(model.parameters(), flags):
        p.requires_grad_(flag)
    from headwise.analysis import importance

    runs = []
    plain = importance.checkpoint

    def counted(fn, *args, **kwargs):  # count every run of a block's forward: the first one and the recompute
        return plain(lambda *a, **k: runs.append(1) or fn(*a, **k), *args, **kwargs)

    importance.checkpoint = counted
    try:
        recomputed, n = gradient_sums(model, tokenizer, TEXTS, batch_size=2, checkpoint_blocks=True)
    finally:
        importance.checkpoint = plain
    kept, m = gradient_sums(model, tokenizer, TEXTS, batch_size=2, checkpoint_blocks=False)
    assert len(runs) == 2 * 2 * 3  # two blocks, three batches: each block run again in the backward
    assert n == m == len(TEXTS) and torch.allclose(recomputed, kept, rtol=1e-5, atol=1e-9) and kept.min() > 0
    assert model.config.use_cache is True
    assert not any("forward" in module.__dict__ for module in model.modules())
    assert [p.requires_grad for p in model.parameters()] == flags and all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_activation_estimate_matches_what_autograd_keeps(kind):
    """``activation_bytes`` (what decides whether analyze keeps or recomputes the blocks' activations) against the
    bytes autograd actually saves in one frozen-weight forward with observers that read probabilities by query rows
    (as the statistics do: SDPA), counted by ``saved_tensors_hooks``: an upper estimate (every MLP counted as a
    gated one), within 2x."""
    from headwise.analysis.activations import activation_bytes
    from headwise.analysis.attach import per_site
    from headwise.batching import text_batches
    from headwise.analysis.importance import frozen, row_gates
    from headwise.analysis.rows import rows_of
    from headwise.runtime import eval_mode, using_headwise

    tokenizer = word_tokenizer(kind)
    model = _tiny_causal_lm() if kind == "llama" else loud_model(kind)
    rows = rows_of(model)
    batch = next(text_batches(tokenizer, random_texts(4, seed=1), 4, 24, "cpu"))
    weights = {p.data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def count(t: torch.Tensor) -> torch.Tensor:
        if t.data_ptr() not in weights:
            seen[t.data_ptr()] = max(seen.get(t.data_ptr(), 0), t.numel() * t.element_size())
        return t

    class Ignore:  # an observer that reads probabilities by query rows, as the statistics do: the module runs SDPA
        takes_rows = True

        def __call__(self, probs, keep, out):
            return None

    def ignore(site, first, n):
        return Ignore()

    with using_headwise(model), eval_mode(model), frozen(model), row_gates(model, rows) as gates, \
            per_site(model, rows, ignore), torch.enable_grad(), \
            torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
        gates.set(gates.ones(4, "cpu").requires_grad_())
        model(**batch.inputs)
    tokens = batch.input_ids.numel()
    estimate = activation_bytes(model, rows, tokens)
    assert 0.9 * sum(seen.values()) <= estimate <= 2 * sum(seen.values())


def _layered_lm(family: str, layers: int = 5, **extra):
    """A tiny causal LM of ``family`` with ``layers`` blocks (5: segments of 2 do not divide them)."""
    import transformers as tf

    from test_analysis_support import VOCAB

    torch.manual_seed(4)
    if family == "gpt2":
        config = tf.GPT2Config(n_embd=32, n_layer=layers, n_head=4, vocab_size=VOCAB, bos_token_id=0,
                               eos_token_id=0, n_positions=64)
    else:
        config = getattr(tf, f"{family.capitalize()}Config")(
            hidden_size=32, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=37, vocab_size=VOCAB, max_position_embeddings=64, **extra)
    return tf.AutoModelForCausalLM.from_config(config, attn_implementation="headwise").eval()


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_segments_and_mlp_chunks_give_the_same_gradient(family, monkeypatch):
    """``Recompute(segment=2, mlp_tokens=3)`` on 5 blocks (segments of 2, 2 and 1) with the lm task's loss: the
    gradient of every head equals the one with every activation kept; blocks run again as the segments say, each
    MLP over chunks of at most 3 positions; nothing stays patched."""
    from headwise.analysis import importance, layer_stack
    from headwise.analysis.activations import Recompute
    from headwise.analysis.importance import gradient_sums
    from headwise.tasks import LanguageModeling

    model, tokenizer = _layered_lm(family), word_tokenizer("llama" if family == "llama" else family)
    loss = LanguageModeling().loss
    texts = random_texts(5, seed=2, shortest=6, longest=12)
    kept, n = gradient_sums(model, tokenizer, texts, batch_size=2, loss_fn=loss, checkpoint_blocks=False)
    runs, widths = [], []
    plain, chunked = importance.checkpoint, layer_stack._chunked_mlp

    def counted(fn, *args, **kwargs):
        return plain(lambda *a, **k: runs.append(fn) or fn(*a, **k), *args, **kwargs)

    def measured(mlp, tokens):
        run = chunked(mlp, tokens)
        return lambda x: widths.append(x.shape[-2]) or run(x)

    monkeypatch.setattr(importance, "checkpoint", counted)
    monkeypatch.setattr(layer_stack, "_chunked_mlp", measured)
    recomputed, m = gradient_sums(model, tokenizer, texts, batch_size=2, loss_fn=loss,
                                  checkpoint_blocks=Recompute(segment=2, mlp_tokens=3))
    assert n == m == 5 and kept.min() > 0
    torch.testing.assert_close(recomputed, kept, rtol=1e-5, atol=1e-9)
    blocks = model.model.layers if family == "llama" else model.transformer.h
    block_runs = sum(1 for fn in runs if getattr(fn, "__self__", None) in set(blocks))
    # per batch, a segment of s blocks runs each block in the forward and again alone in the backward; the
    # segment's own recomputation stops once it has its last block's input (s − 1 runs): 5 + 5 + 2 of 5 blocks
    assert block_runs == 3 * 12
    assert widths and max(widths) > 3  # the MLPs saw whole batches and chunked them
    assert not any("forward" in module.__dict__ for module in model.modules())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", ["llama", "qwen2-sliding"])
def test_the_layer_by_layer_backward_gives_the_same_gradient(family, dtype, monkeypatch):
    """``Recompute(layer_tokens=t)`` (``analysis.layerwise``) with the lm task's loss on padded batches of texts of
    6 to 20 tokens: every head's gradient equals the one with every activation kept, for chunks of 1, 3 and 7
    queries (not dividing the lengths) and of 64 (one chunk); a Qwen2 whose layers alternate full and sliding-window
    masks (each layer replayed with its own). Each layer's input goes to disk once per batch, and nothing stays
    patched. bfloat16: the same to its rounding."""
    from headwise.analysis import layerwise
    from headwise.analysis.activations import Recompute
    from headwise.analysis.importance import gradient_sums
    from headwise.tasks import LanguageModeling

    extra = dict(use_sliding_window=True, sliding_window=3, max_window_layers=2) if family != "llama" else {}
    model = _layered_lm(family.split("-")[0], layers=4, **extra).to(dtype)
    tokenizer, loss = word_tokenizer("llama"), LanguageModeling().loss
    texts = random_texts(5, seed=2, shortest=6, longest=20)
    kept, n = gradient_sums(model, tokenizer, texts, batch_size=2, loss_fn=loss, checkpoint_blocks=False)
    puts = []
    monkeypatch.setattr(layerwise.TensorFile, "put",
                        lambda self, t, original=layerwise.TensorFile.put: puts.append(t.shape) or original(self, t))
    tolerance = dict(rtol=1e-5, atol=1e-9) if dtype == torch.float32 else dict(rtol=0.05, atol=1e-3)
    for tokens in (1, 3, 7, 64):
        by_layer, m = gradient_sums(model, tokenizer, texts, batch_size=2, loss_fn=loss,
                                    checkpoint_blocks=Recompute(layer_tokens=tokens))
        assert n == m == 5 and kept.min() > 0
        torch.testing.assert_close(by_layer, kept, **tolerance)
    assert len(puts) == 4 * 3 * 4  # chunk sizes × batches × layers
    assert not any("forward" in module.__dict__ for module in model.modules())


def test_the_layer_by_layer_backward_refuses_a_loss_that_runs_the_model_twice():
    """The layer-by-layer pass replays one forward per batch: a loss that runs the layers twice (two embeddings of a
    pair) is refused in one line naming the way out, and the model is left unpatched."""
    from headwise.analysis.activations import Recompute
    from headwise.analysis.importance import gradient_sums
    from headwise.tasks import LanguageModeling

    model, tokenizer = _layered_lm("llama", layers=2), word_tokenizer("llama")
    loss = LanguageModeling().loss

    def twice(model, batch):
        return loss(model, batch) + loss(model, batch)

    with pytest.raises(HeadwiseError, match="more than once per batch.*recompute=False"):
        gradient_sums(model, tokenizer, random_texts(2, seed=1), batch_size=2, loss_fn=twice,
                      checkpoint_blocks=Recompute(layer_tokens=4))
    assert not any("forward" in module.__dict__ for module in model.modules())


def test_segments_refuse_blocks_with_different_masks():
    """Sliding-window and full layers get different masks: ``recompute_plan`` keeps segments of one block for such
    a model however small the margin, and segments forced on it are refused in one line (the segment would run
    every block with its first block's mask)."""
    from headwise.analysis import activations
    from headwise.analysis.activations import Recompute, recompute_plan
    from headwise.analysis.importance import gradient_sums
    from headwise.tasks import LanguageModeling

    model = _layered_lm("qwen2", layers=4, use_sliding_window=True, sliding_window=3, max_window_layers=2)
    assert len(set(model.config.layer_types)) == 2
    tokenizer, texts = word_tokenizer("llama"), random_texts(2, seed=2, shortest=8, longest=8)
    rows = rows_of(model)
    original = activations.margin_bytes
    try:
        activations.margin_bytes = lambda model: 1
        assert recompute_plan(model, rows, 2, 10).segment == 1
    finally:
        activations.margin_bytes = original
    with pytest.raises(HeadwiseError, match="different arguments"):
        gradient_sums(model, tokenizer, texts, batch_size=2, loss_fn=LanguageModeling().loss,
                      checkpoint_blocks=Recompute(segment=3))  # blocks 0-1 full, block 2 sliding
    assert not any("forward" in module.__dict__ for module in model.modules())


def test_recompute_plan_fits_the_margin(monkeypatch):
    """The plan by the margin, on SmolLM2-135M's shape (30 blocks, hidden 576, MLP 1,536; built on ``meta``): a
    margin of 0.2x its 513 MiB keeps nothing at 512 tokens, recomputes each block with whole MLPs at 128 tokens,
    and at 2,048 tokens goes layer by layer with chunks of queries whose activations fit ``metrics.block_bytes``;
    a GPT-2 of the same size (learned positions: its layers do not run by chunks of queries) recomputes segments of
    6 blocks (11 hidden states held instead of 30) with MLP chunks whose activations fit a quarter of the margin; a
    margin of 64 MiB (the floor) on a tiny model keeps them."""
    import transformers as tf

    from headwise.analysis import metrics
    from headwise.analysis.activations import MARGIN, Recompute, keep_activations, margin_bytes, recompute_plan

    config = tf.LlamaConfig(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                            intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True, head_dim=64)
    with torch.device("meta"):
        model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="headwise")
    rows = rows_of(model)
    weights = sum(p.numel() * 4 for p in model.parameters())
    monkeypatch.setattr("headwise.analysis.activations.available_bytes", lambda device: 1 << 40)
    assert margin_bytes(model) == int(MARGIN * weights)
    assert not keep_activations(model, rows, 512)
    assert recompute_plan(model, rows, 1, 128) == Recompute(1, None)
    plan = recompute_plan(model, rows, 1, 2048)  # 30 hidden states and a block do not fit: layer by layer
    assert plan.segment == 1 and plan.mlp_tokens is None and 128 <= plan.layer_tokens < 2048
    per_token = 2 * 4 * (3 * 576 + 3 * 1536 + 4 * 576 + 9) + 2048 * 5  # a chunk's activations, gradients, mask
    assert plan.layer_tokens * per_token <= metrics.block_bytes(torch.device("cpu"))
    assert 128 <= recompute_plan(model, rows, 1, 8192).layer_tokens < plan.layer_tokens  # a longer mask per query
    pairs = recompute_plan(model, rows, 1, 2048, one_forward=False)  # two forwards a batch (pairs): segments
    assert pairs.segment == 6 and pairs.layer_tokens is None
    gpt2 = tf.GPT2Config(n_embd=576, n_layer=30, n_head=9, n_inner=1536, vocab_size=49152, n_positions=2048)
    with torch.device("meta"):
        learned = tf.AutoModelForCausalLM.from_config(gpt2, attn_implementation="headwise")
    plan = recompute_plan(learned, rows_of(learned), 1, 2048)  # learned positions: no chunks of queries, segments
    assert plan.segment == 6 and 128 <= plan.mlp_tokens < 2048 and plan.layer_tokens is None
    assert 6 * plan.mlp_tokens * 1536 * 4 <= margin_bytes(learned) // 4
    tiny = _layered_lm("llama")
    assert keep_activations(tiny, rows_of(tiny), 4 * 64)
