"""Head roles after Voita et al. (2019), "Analyzing Multi-Head Self-Attention", reported per attention kind.

All roles look at the key a query row gives its largest weight (its argmax), over real query rows and the
valid keys of each row (``keep`` ∧ real key):

- **positional** (``enc-self``, ``dec-self``): the argmax is the previous token (``prev``: ``j = i − 1``) or the
  next one (``next``: ``j = i + 1``) for at least ``positional_threshold`` of the rows (Voita: 90%). Row 0 has
  no previous token and counts as a miss, as in the paper.
- **rare** (all kinds; keys are source tokens for ``enc-self``/``dec-enc``, target tokens for ``dec-self``): the
  argmax is a position holding the sentence's least frequent token for at least ``rare_threshold`` of the rows.
  Frequencies come from a given count table or from the token counts of the analysed batches; special ids
  (padding, BOS/EOS, decoder start) are never "rare". Sentences whose eligible tokens all have the same
  frequency have no rarest token and are left out.
- **alignment** (``dec-enc``): with a given word alignment (``alignment[B, T, S]`` bool, target rows over source
  columns, in decoder-input positions), the share of aligned target rows whose argmax is an aligned source
  token. Without one, a diagonal proxy: the share of rows whose argmax lies within ``diagonal_window`` tokens
  of the diagonal ``c = r·(S−1)/(T−1)`` (``r``, ``c``: ranks among the real target / source tokens), and the
  head must also be sharp (mean largest weight ≥ ``alignment_confidence``). The proxy finds heads that follow
  the sentence order monotonically; it misses alignment heads of language pairs with much reordering.

Voita's syntactic role needs a dependency parser and is not computed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch
from torch import nn

from ..errors import HeadwiseError
from ..sites import AttentionSite, find_sites
from ..runtime import eval_mode, using_headwise
from ..runtime.gates import layer_of
from ..runtime.probs import ProbRows
from .attach import observed_call, per_site
from .metrics import query_blocks
from .rows import Row

ROLES = ("positional", "rare", "alignment")
SCORES = ("prev", "next", "rare", "alignment", "confidence")


@dataclass
class RoleConfig:
    """Thresholds of ``head_roles`` (shares of query rows, in [0, 1]) and the diagonal window (tokens)."""

    positional_threshold: float = 0.9
    rare_threshold: float = 0.5
    alignment_threshold: float = 0.5
    alignment_confidence: float = 0.5
    diagonal_window: int = 1

    def __post_init__(self) -> None:
        for name in ("positional_threshold", "rare_threshold", "alignment_threshold", "alignment_confidence"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise HeadwiseError(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        if self.diagonal_window < 0:
            raise HeadwiseError(f"diagonal_window must be ≥ 0 tokens, got {self.diagonal_window}")


def rarest_positions(ids: torch.Tensor, real: torch.Tensor, frequency: torch.Tensor,
                     special_ids: Sequence[int] = ()) -> torch.Tensor:
    """``[B, T]`` bool: positions holding their sentence's least frequent eligible token (all False for a sentence
    whose eligible tokens are equally frequent). ``frequency[vocab]`` counts; special ids are not eligible."""
    eligible = real.bool().clone()
    for i in special_ids:
        eligible &= ids != i
    freq = frequency.to(ids.device, torch.float64)[ids].masked_fill(~eligible, float("inf"))
    rarest = eligible & (freq == freq.amin(1, keepdim=True))
    distinct = rarest.sum(1) < eligible.sum(1)
    return rarest & distinct[:, None]


def _rank(real: torch.Tensor) -> torch.Tensor:
    """Position of each token among the real tokens of its row (``[B, T]``, float64)."""
    return (real.long().cumsum(1) - 1).double()


@torch.no_grad()
def role_sums(probs: torch.Tensor | ProbRows, keep: torch.Tensor | None, kind: str, q_real: torch.Tensor,
              k_real: torch.Tensor, k_rarest: torch.Tensor | None = None, alignment: torch.Tensor | None = None,
              window: int = 1) -> dict[str, torch.Tensor]:
    """Counts behind the roles for one batch of one layer.

    ``probs[B, H, Tq, Tk]`` with ``keep[B|1, 1|H, Tq, Tk]`` or None, or a ``ProbRows`` (``keep`` None); ``q_real[B,
    Tq]``, ``k_real[B, Tk]``, ``k_rarest[B, Tk]`` bool; ``alignment[B, Tq, Tk]`` bool (``dec-enc`` only). Returns
    float64 ``[H]`` hit counts ``prev``, ``next`` (self kinds), ``rare``, ``alignment`` and ``confidence`` (sum of
    row maxima) with their row counts ``rows``, ``rare_rows``, ``alignment_rows`` (scalars). Every count is a sum
    over query rows of each row's argmax: the maps are read by blocks of rows (``metrics.query_blocks``) and the
    counts are those of the whole map.
    """
    B, H, Tq, Tk = probs.shape
    device = q_real.device
    q_real, k_real = q_real.bool(), k_real.bool()
    sums: dict[str, torch.Tensor] = {"rows": torch.zeros((), dtype=torch.float64, device=device),
                                     "confidence": torch.zeros(H, dtype=torch.float64, device=device)}
    if kind != "dec-enc":
        sums["prev"], sums["next"] = torch.zeros_like(sums["confidence"]), torch.zeros_like(sums["confidence"])
    if k_rarest is not None:
        sums["rare"], sums["rare_rows"] = torch.zeros_like(sums["confidence"]), torch.zeros_like(sums["rows"])
    if kind == "dec-enc":
        sums["alignment"], sums["alignment_rows"] = torch.zeros_like(sums["confidence"]), torch.zeros_like(sums["rows"])
        if alignment is None:
            q_rank, k_rank = _rank(q_real), _rank(k_real)
            slope = (k_real.sum(1) - 1).double() / (q_real.sum(1) - 1).clamp(min=1).double()  # [B]
            expected = q_rank * slope[:, None]  # [B, Tq]

    def hits(hit: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
        return (hit & where).sum((0, 2)).double()

    for q0, q1, weights, keep_q in query_blocks(probs, keep):  # [B, H, n, k] float32, [B|1, 1|H, n, k] | None
        q, n, k = slice(q0, q1), q1 - q0, weights.shape[-1]
        valid = q_real[:, None, q, None] & k_real[:, None, None, :k]
        if keep_q is not None:
            valid = valid & keep_q.bool()
        weights.masked_fill_(~valid, -1.0)  # invalid keys never win the argmax
        top = weights.argmax(-1)  # [B, H, n]
        rows = valid.any(-1).expand(B, H, n)  # real rows that see a key
        sums["rows"] += rows[:, 0].sum().double()
        sums["confidence"] += (weights.amax(-1).clamp(min=0) * rows).sum((0, 2)).double()
        if kind != "dec-enc":
            pos = torch.arange(q0, q1, device=device)[None, None, :]
            sums["prev"] += hits(top == pos - 1, rows)
            sums["next"] += hits(top == pos + 1, rows)
        if k_rarest is not None:
            eligible = rows & k_rarest.any(1)[:, None, None]
            sums["rare"] += hits(k_rarest[:, None, :k].expand(B, H, k).gather(2, top), eligible)
            sums["rare_rows"] += eligible[:, 0].sum().double()
        if kind == "dec-enc":
            if alignment is not None:
                aligned = rows & alignment[:, q].bool().any(-1)[:, None, :]
                hit = alignment[:, None, q, :k].bool().expand(B, H, n, k).gather(3, top[..., None])[..., 0]
            else:
                got = k_rank[:, None, :k].expand(B, H, k).gather(2, top)  # [B, H, n]
                hit, aligned = (got - expected[:, None, q]).abs() <= window, rows
            sums["alignment"] += hits(hit, aligned)
            sums["alignment_rows"] += aligned[:, 0].sum().double()
        del weights, valid, top  # freed before the next block is computed
    return sums


def _share(hit: torch.Tensor | None, n: torch.Tensor | None) -> list[float | None]:
    if hit is None or n is None or float(n) == 0:
        return [None] * (0 if hit is None else hit.numel())
    return (hit / n).tolist()


def scores_of(sums: dict[str, torch.Tensor], heads: int) -> dict[str, list[float | None]]:
    """Per-head shares (``SCORES``) from accumulated ``role_sums``; None where the kind or data has none."""
    rows = sums.get("rows")
    out = {name: _share(sums.get(name), rows) for name in ("prev", "next", "confidence")}
    out["rare"] = _share(sums.get("rare"), sums.get("rare_rows"))
    out["alignment"] = _share(sums.get("alignment"), sums.get("alignment_rows"))
    return {name: values or [None] * heads for name, values in out.items()}


def roles_of(scores: dict[str, list[float | None]], kind: str, config: RoleConfig, aligned: bool) -> list[list[str]]:
    """The roles of each head (``"positional:prev"``, ``"positional:next"``, ``"rare"``, ``"alignment"``)."""
    def at_least(name: str, h: int, t: float) -> bool:
        v = scores[name][h]
        return v is not None and v >= t

    heads = len(scores["confidence"])
    found: list[list[str]] = []
    for h in range(heads):
        roles = [f"positional:{d}" for d in ("prev", "next") if at_least(d, h, config.positional_threshold)]
        if at_least("rare", h, config.rare_threshold):
            roles.append("rare")
        if kind == "dec-enc" and at_least("alignment", h, config.alignment_threshold) and (
                aligned or at_least("confidence", h, config.alignment_confidence)):
            roles.append("alignment")
        found.append(roles)
    return found


@dataclass
class HeadRoles:
    """Role scores and roles per row (one row per site and layer, all three kinds).

    ``scores[name][row][head]``: shares in [0, 1] or None; ``roles[row][head]``: role labels.
    """

    sites: list[dict]
    scores: dict[str, list[list[float | None]]]
    roles: list[list[list[str]]]
    config: dict
    alignment_source: str  # "given alignment" or "diagonal proxy"
    frequency_source: str  # "given counts" or "analysed batches"

    def by_kind(self) -> dict[str, dict[str, list[str]]]:
        """``{kind: {role: ["dec-enc.1 H2", ...]}}`` (roles without heads are absent)."""
        out: dict[str, dict[str, list[str]]] = {}
        for site, row in zip(self.sites, self.roles):
            table = out.setdefault(site["kind"], {})
            for h, roles in enumerate(row):
                for role in roles:
                    table.setdefault(role, []).append(f"{site['name']} H{h}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"headwise_roles": 1, "sites": self.sites, "scores": self.scores, "roles": self.roles,
                "config": self.config, "alignment_source": self.alignment_source,
                "frequency_source": self.frequency_source, "by_kind": self.by_kind()}


@dataclass
class _Batch:
    """What observers need about the batch in flight (source = encoder side; target = decoder side)."""

    src_real: torch.Tensor | None = None
    tgt_real: torch.Tensor | None = None
    src_rarest: torch.Tensor | None = None
    tgt_rarest: torch.Tensor | None = None
    alignment: torch.Tensor | None = None


class _RoleObserver:
    """Adds ``role_sums`` of every call into ``totals[row]``; takes rows (``ProbRows``), so the module runs SDPA."""

    takes_rows = True

    def __init__(self, site: AttentionSite, first_row: int, n_layers: int, batch: _Batch,
                 totals: dict[int, dict[str, torch.Tensor]], window: int) -> None:
        self.site, self.first_row, self.n_layers, self.batch, self.totals = site, first_row, n_layers, batch, totals
        self.window, self.calls = window, 0

    def __call__(self, probs: torch.Tensor | ProbRows, keep: torch.Tensor | None, out: torch.Tensor) -> None:
        row, b, kind = self.first_row + layer_of(self, self.n_layers), self.batch, self.site.kind
        q_real, q_rarest = (b.src_real, b.src_rarest) if kind == "enc-self" else (b.tgt_real, b.tgt_rarest)
        k_real, k_rarest = (q_real, q_rarest) if kind != "dec-enc" else (b.src_real, b.src_rarest)
        if q_real.shape[1] != probs.shape[2] or k_real.shape[1] != probs.shape[3]:
            raise HeadwiseError(f"{self.site.name}: attention map {tuple(probs.shape)} does not match the batch's "
                                f"masks ({tuple(q_real.shape)} queries, {tuple(k_real.shape)} keys)")
        sums = role_sums(probs, keep, kind, q_real, k_real, k_rarest, b.alignment if kind == "dec-enc" else None,
                         self.window)
        acc = self.totals.setdefault(row, {})
        for name, value in sums.items():
            acc[name] = acc[name] + value if name in acc else value


def _special_ids(model: nn.Module) -> list[int]:
    config = model.config
    names = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")
    return sorted({int(i) for i in (getattr(config, n, None) for n in names) if isinstance(i, int)})


def _sides(batch: Mapping[str, torch.Tensor]) -> tuple[tuple, tuple]:
    """``(ids, real)`` of the source side and of the target side (a decoder-only model: both the input)."""
    if "input_ids" not in batch:
        raise HeadwiseError(f"role analysis needs token ids: batch keys {sorted(batch)} lack 'input_ids'")
    src = (batch["input_ids"], batch.get("attention_mask", torch.ones_like(batch["input_ids"])).bool())
    if "decoder_input_ids" not in batch:
        return src, src
    ids = batch["decoder_input_ids"]
    return src, (ids, batch.get("decoder_attention_mask", torch.ones_like(ids)).bool())


def corpus_counts(batches: Iterable[Mapping[str, torch.Tensor]], vocab_size: int) -> torch.Tensor:
    """``[vocab]`` token counts over the real tokens of both sides of ``batches`` (each input counted once)."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for batch in batches:
        src, tgt = _sides(batch)
        for ids, real in (src,) if tgt is src else (src, tgt):
            counts += torch.bincount(ids[real].cpu(), minlength=vocab_size)[:vocab_size].double()
    return counts


@torch.no_grad()
def head_roles(model: nn.Module, batches: Sequence[Mapping[str, torch.Tensor]], config: RoleConfig | None = None,
               counts: torch.Tensor | Mapping[int, int] | None = None,
               special_ids: Sequence[int] | None = None) -> HeadRoles:
    """Voita's head roles of every site of ``model`` (all kinds) over ``batches`` of model inputs.

    ``batches``: dicts of ``input_ids``/``attention_mask`` and, for encoder-decoders, ``decoder_input_ids``/
    ``decoder_attention_mask`` (e.g. labels shifted right); an optional ``alignment`` entry ``[B, T, S]`` bool
    gives word alignments for ``dec-enc`` (decoder-input positions; it is not passed to the model).
    ``counts``: token frequencies (``[vocab]`` tensor or ``{id: count}``); default: counted over ``batches``.
    ``special_ids``: never rare (default: the config's pad/BOS/EOS/decoder-start ids).
    """
    config = config or RoleConfig()
    batches = list(batches)
    if not batches:
        raise HeadwiseError("no batches to analyse")
    aligned = [b.get("alignment") is not None for b in batches]
    if any(aligned) and not all(aligned):
        raise HeadwiseError("give an 'alignment' in every batch or in none (the alignment score would mix two "
                            "definitions otherwise)")
    vocab = int(model.config.get_text_config().vocab_size)
    if counts is None:
        frequency = corpus_counts(batches, vocab)
    elif isinstance(counts, Mapping):
        frequency = torch.zeros(vocab, dtype=torch.float64)
        for token, n in counts.items():
            frequency[int(token)] = float(n)
    else:
        frequency = torch.as_tensor(counts, dtype=torch.float64)
        if frequency.shape != (vocab,):
            raise HeadwiseError(f"counts has shape {tuple(frequency.shape)}; give one count per token id ({vocab},) "
                                "or a {token id: count} mapping")
    specials = _special_ids(model) if special_ids is None else list(special_ids)
    rows = [Row(i, site, layer) for i, (site, layer) in enumerate((s, x) for s in find_sites(model) for x in s.layers)]
    state, totals = _Batch(), {}
    build = lambda site, first, n: _RoleObserver(site, first, n, state, totals, config.diagonal_window)  # noqa: E731
    device = next(model.parameters()).device
    with using_headwise(model), eval_mode(model), per_site(model, rows, build, prefix="roles"):
        for batch in batches:
            (src_ids, src_real), (tgt_ids, tgt_real) = _sides(batch)
            state.src_real, state.tgt_real = src_real.to(device), tgt_real.to(device)
            state.src_rarest = rarest_positions(src_ids.to(device), state.src_real, frequency, specials)
            state.tgt_rarest = rarest_positions(tgt_ids.to(device), state.tgt_real, frequency, specials)
            state.alignment = None if batch.get("alignment") is None else batch["alignment"].to(device)
            observed_call(model, {k: v.to(device) for k, v in batch.items() if k != "alignment"})
    scores: dict[str, list] = {name: [] for name in SCORES}
    roles = []
    for r in rows:
        row_scores = scores_of(totals.get(r.index, {}), r.site.num_heads)
        for name in SCORES:
            scores[name].append(row_scores[name])
        roles.append(roles_of(row_scores, r.site.kind, config, any(aligned)))
    return HeadRoles(sites=[r.describe() | {"name": f"{r.site.kind}.{r.layer}", "layers": [r.layer]} for r in rows],
                     scores=scores, roles=roles, config=asdict(config),
                     alignment_source="given alignment" if any(aligned) else "diagonal proxy",
                     frequency_source="analysed batches" if counts is None else "given counts")


def role_metric(batches: Sequence[Mapping[str, torch.Tensor]], name: str = "confidence",
                config: RoleConfig | None = None) -> Callable[[nn.Module, list[AttentionSite]], torch.Tensor]:
    """A ``headwise.mixing.DynamicSwap`` metric for every kind, encoder-decoders included: ``head_roles`` on
    ``batches`` → the ``[L, H]`` score ``name`` (one of ``SCORES``; ``confidence`` is MHR's) of the given sites."""
    if name not in SCORES:
        raise HeadwiseError(f"unknown role score {name!r}; use one of {', '.join(SCORES)}")

    def measure(model: nn.Module, sites: list[AttentionSite]) -> torch.Tensor:
        roles = head_roles(model, batches, config)
        rows = {(s["path"], s["layers"][0]): r for r, s in enumerate(roles.sites)}
        table = [roles.scores[name][rows[(s.path, layer)]] for s in sites for layer in s.layers]
        if any(v is None for row in table for v in row):
            raise HeadwiseError(f"role score {name!r} is not defined for these sites ({sites[0].kind})")
        return torch.tensor(table, dtype=torch.float32)

    return measure
