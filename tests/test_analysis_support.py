"""Helpers for the analysis tests (no tests here): a word-level tokenizer for the tiny models, random texts, and
independent references that run the *eager* model and compute every statistic from full maps with plain loops."""

from __future__ import annotations

import random

import numpy as np
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from headwise.sites import find_sites
from tiny import CAUSAL, VOCAB, tiny_model


THRESHOLDS = (1e-4, 1e-3, 1e-2, 0.1)


def loud_model(family: str, attn: str = "headwise"):
    """``tiny_model`` with matrices redrawn at std 0.4 (same draw for every ``attn``): attention is far from
    uniform and every head changes the output, so the checks below can tell heads and positions apart."""
    model = tiny_model(family, attn)
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.4)
    return model


def word_tokenizer(family: str) -> PreTrainedTokenizerFast:
    """Words ``w4`` … ``w96`` map to their ids. Encoders get ``[CLS] … [SEP]``; causal families a BOS ``<s>`` (id 0,
    GPT-2's tiny bos id) and no pad token, like GPT-2's own tokenizer."""
    if family in CAUSAL:
        vocab = {"<s>": 0, "[UNK]": 1, "x2": 2, "x3": 3}
        template, specials = "<s> $A", [("<s>", 0)]
        kwargs = dict(bos_token="<s>", unk_token="[UNK]")
    else:
        vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3}
        template, specials = "[CLS] $A [SEP]", [("[CLS]", 2), ("[SEP]", 3)]
        kwargs = dict(pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]")
    vocab.update({f"w{i}": i for i in range(4, VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single=template, special_tokens=specials)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)
    tokenizer.model_max_length = 64
    return tokenizer


def random_texts(n: int, seed: int = 0, shortest: int = 1, longest: int = 9) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(f"w{rng.randrange(4, VOCAB)}" for _ in range(rng.randint(shortest, longest))) for _ in range(n)]


def padded(tokenizer, texts: list[str]) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """One right-padded batch: inputs, real ``[B, T]`` and special ``[B, T]`` masks (independent of headwise)."""
    enc = tokenizer(texts, return_special_tokens_mask=True)
    T = max(len(x) for x in enc["input_ids"])
    ids = torch.zeros(len(texts), T, dtype=torch.long)
    real = torch.zeros(len(texts), T, dtype=torch.bool)
    special = torch.zeros(len(texts), T, dtype=torch.bool)
    for b, (x, s) in enumerate(zip(enc["input_ids"], enc["special_tokens_mask"])):
        ids[b, : len(x)], real[b, : len(x)], special[b, : len(x)] = torch.tensor(x), True, torch.tensor(s).bool()
    return {"input_ids": ids, "attention_mask": real.long()}, real, special


def site_calls(model) -> list[tuple[object, int, int]]:
    """``(site, first row, layers)`` for every self-attention site, in table order."""
    out, row = [], 0
    for site in find_sites(model):
        if site.kind != "dec-enc":
            out.append((site, row, len(site.layers)))
            row += len(site.layers)
    return out


def run_eager(model, inputs: dict, gate: torch.Tensor | None = None, grad: bool = False):
    """Run the eager ``model``; returns (output, attentions per row, per-head outputs Z ``[B, T, H, d]`` per row).

    ``gate[rows, B|1, H]`` multiplies each head's output (a pre-hook on the output projection, counting calls).
    """
    zs: dict[int, torch.Tensor] = {}
    handles = []
    for site, first, n in site_calls(model):
        state = {"k": 0}

        def hook(module, args, site=site, first=first, n=n, state=state):
            row = first + state["k"] % n
            state["k"] += 1
            x = args[0]
            z = x.unflatten(-1, (site.num_heads, site.head_dim))
            zs[row] = z.detach().clone()
            if gate is not None:
                z = z * gate[row][:, None, :, None].to(z.dtype)
                return (z.flatten(-2),) + tuple(args[1:])
            return None

        handles.append(site.o.module.register_forward_pre_hook(hook))
    try:
        with torch.set_grad_enabled(grad):
            out = model(**inputs, output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    return out, [a.detach() for a in out.attentions], [zs[r] for r in range(len(zs))]


def pooled_unit(out, mask: torch.Tensor) -> torch.Tensor:
    h = out.last_hidden_state
    m = mask[:, :, None].to(h.dtype)
    return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1)


def reference_stats(model_eager, tokenizer, texts: list[str], causal: bool, thresholds=THRESHOLDS) -> dict:
    """Every statistic computed directly from full eager maps of one padded batch, with loops over sentences,
    heads and query rows (float64)."""
    inputs, real, special = padded(tokenizer, texts)
    _, maps, zs = run_eager(model_eager, inputs)
    edges = 10.0 ** np.linspace(-8, 0, 101)
    edges[0] -= 1e-9
    R, H = len(maps), maps[0].shape[1]
    names = ["confidence", "confidence_no_special", "mhr_base", "mhr_advanced", "entropy", "distance", "special",
             "self", "prev", "next"] + [f"sparsity@{t:g}" for t in thresholds]
    heads = {k: np.zeros((R, H)) for k in names}
    hist = np.zeros((R, H, 100))
    sim = {k: np.zeros((R, H, H)) for k in ("attention_cosine", "attention_l2", "output_cosine", "output_l2")}
    for r in range(R):
        n_rows = n_plain = n_sent = 0
        sums = {k: np.zeros(H) for k in names}
        entries = np.zeros(H)
        for b in range(len(texts)):
            n = int(real[b].sum())
            spec = special[b, :n].numpy()
            vis = np.tril(np.ones((n, n), bool)) if causal else np.ones((n, n), bool)
            n_sent += 1
            n_rows += n
            n_plain += int((~spec).sum())
            att = [maps[r][b, h, :n, :n].double().numpy() * vis for h in range(H)]
            z = [zs[r][b, :n, h].double().flatten().numpy() for h in range(H)]
            for h in range(H):
                A = att[h]
                sums["mhr_base"][h] += A[vis].max()
                sums["mhr_advanced"][h] += np.mean([A[vis[:, j], j].max() for j in range(n)])
                for k, t in enumerate(thresholds):
                    sums[f"sparsity@{t:g}"][h] += int((A[vis] <= t).sum())
                entries[h] += vis.sum()
                for i in range(n):
                    row = A[i, vis[i]]
                    cols = np.nonzero(vis[i])[0]
                    sums["confidence"][h] += row.max()
                    if not spec[i]:
                        sums["confidence_no_special"][h] += max(A[i, j] for j in cols if not spec[j])
                    sums["entropy"][h] += -sum(p * np.log(p) for p in row if p > 0)
                    sums["distance"][h] += sum(A[i, j] * abs(i - j) for j in cols)
                    sums["special"][h] += sum(A[i, j] for j in cols if spec[j])
                    sums["self"][h] += A[i, i]
                    sums["prev"][h] += A[i, i - 1] if i > 0 and vis[i, i - 1] else 0.0
                    sums["next"][h] += A[i, i + 1] if i + 1 < n and vis[i, i + 1] else 0.0
                    counts, _ = np.histogram(np.minimum(row + 1e-8, 1.0), bins=edges)
                    hist[r, h] += counts / counts.sum()
                for g in range(H):
                    for kind, vecs in (("attention", [a.flatten() for a in att]), ("output", z)):
                        u, v = vecs[h], vecs[g]
                        sim[f"{kind}_cosine"][r, h, g] += u @ v / (np.linalg.norm(u) * np.linalg.norm(v))
                        sim[f"{kind}_l2"][r, h, g] += np.linalg.norm(u - v)
        for k in names:
            if k.startswith("sparsity@"):
                heads[k][r] = sums[k] / entries
            elif k.startswith("mhr"):
                heads[k][r] = sums[k] / n_sent
            elif k == "confidence_no_special":
                heads[k][r] = sums[k] / n_plain
            else:
                heads[k][r] = sums[k] / n_rows
        for k in sim:
            sim[k][r] /= n_sent
    hist /= hist.sum(-1, keepdims=True)
    return {"heads": heads, "histogram": hist, "similarity": sim}
