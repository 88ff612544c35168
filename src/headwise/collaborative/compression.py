"""``compress(model, dk=...)``: decompose every site, then swap in collaborative scoring, recorded for reload."""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Sequence

import torch
from torch import nn

from ..errors import HeadwiseError
from ..contract import record, with_keywords
from ..progress import progress_bar
from ..runtime.dispatch import refuse_offloaded
from ..runtime.ops import ops_of
from ..sites import AttentionSite, family_layout, recorded_sites, supported_families
from .calibration import input_moments, input_moments_in_groups
from .config import CollaborativeConfig
from .decompose import decompose, relative_error
from .families import CROSS_ATTENTION_FORMS, FORWARDS, install, is_collaborative
from .rotary import decompose_rotary

EDIT_KIND = "collaborative"


@dataclass
class SiteCompression:
    """One converted site. The errors are kept as 0-dim tensors on the site's device (no host sync while
    compressing); ``weight_error`` / ``score_error`` read them as numbers."""

    path: str
    name: str
    dk: int
    device_weight_error: torch.Tensor  # ‖T − T̂‖ / ‖T‖ of the stacked W_q^hᵀ W_k^h
    device_score_error: torch.Tensor | None  # the same in the calibration metric (data-aware objective only)
    params_before: int  # query/key parameters (weights and biases)
    params_after: int  # shared W~q, W~k, mixing, content bias
    seconds: float

    @property
    def weight_error(self) -> float:
        return float(self.device_weight_error)

    @property
    def score_error(self) -> float | None:
        return None if self.device_score_error is None else float(self.device_score_error)

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "name": self.name, "dk": self.dk, "weight_error": self.weight_error,
                "score_error": self.score_error, "params_before": self.params_before,
                "params_after": self.params_after, "seconds": self.seconds}


@dataclass
class Compression:
    dk: int | float  # the requested width: a count, or a fraction of each site's heads × head_dim
    objective: str  # "weights" or "scores"
    sites: list[SiteCompression] = field(default_factory=list)

    @property
    def params_before(self) -> int:
        return sum(s.params_before for s in self.sites)

    @property
    def params_after(self) -> int:
        return sum(s.params_after for s in self.sites)

    def as_dict(self) -> dict[str, Any]:
        return {"dk": self.dk, "objective": self.objective, "params_before": self.params_before,
                "params_after": self.params_after, "sites": [s.as_dict() for s in self.sites]}


def exact_rank(site: AttentionSite) -> int:
    return site.num_heads * site.head_dim


def site_rank(site: AttentionSite, dk: int | float) -> int:
    """The shared width ``site`` gets for ``dk``: ``min(dk, H·d)`` for a count; for a fraction ``0 < dk < 1``,
    that share of the site's own ``H·d`` (rounded to an even number ≥ 2, which rotary planes need), so sites
    left with different head counts (after pruning) shrink alike."""
    if isinstance(dk, float):
        return min(exact_rank(site), max(2, 2 * round(dk * exact_rank(site) / 2)))
    return min(dk, exact_rank(site))


def check_compressible(model: nn.Module, sites: list[AttentionSite], dk: object) -> None:
    """Raise ``HeadwiseError`` (naming the problem and the fix) unless every site can become collaborative."""
    fraction = isinstance(dk, float) and 0 < dk < 1
    if not fraction and (isinstance(dk, bool) or not isinstance(dk, int) or dk <= 0):
        raise HeadwiseError(f"dk must be a positive integer (the width of the shared query/key space) or a fraction "
                            f"0 < dk < 1 of each site's heads × head_dim, got {dk!r}; the exact form of this model "
                            f"is dk={max(exact_rank(s) for s in sites)}")
    for site in sites:
        if site.layout.attention_form not in FORWARDS:
            why = (" Its query and key have biases, which rotary positions turn into position-dependent score "
                   "terms that shared rotation planes cannot keep" if site.positions == "rotary" else "")
            supported = [f for f in supported_families() if family_layout(f).attention_form in FORWARDS]
            raise HeadwiseError(f"collaborative heads do not support {site.family} ({type(model).__name__}).{why} "
                                f"Supported: {', '.join(supported)}")
        if site.positions == "rotary":
            _check_rotary(site, site_rank(site, dk))
        elif site.positions != "absolute" and not site.layout.position_bias:
            raise HeadwiseError(f"{site.name}: {site.positions} position scores depend on per-head queries and keys, "
                                "which collaborative heads replace; only absolute positions are supported")
        if site.kind == "dec-enc" and site.layout.attention_form not in CROSS_ATTENTION_FORMS:
            cross = [f for f in supported_families() if family_layout(f).attention_form in CROSS_ATTENTION_FORMS]
            raise HeadwiseError(f"{site.name} is cross-attention, which collaborative heads convert only for "
                                f"{', '.join(cross)} ({site.family}'s collaborative forward scores "
                                "self-attention only); pass kinds=['enc-self', 'dec-self'] (--kinds enc-self,dec-self)")
        if is_collaborative(site.module):
            raise HeadwiseError(f"{site.name} is already collaborative; compress the original model to change dk")
        ops = ops_of(site)
        if ops is not None and len(ops.mechanism):
            raise HeadwiseError(f"{site.name} runs a mechanism ({next(iter(ops.mechanism))}); "
                                "detach it before compressing")


def _check_rotary(site: AttentionSite, dk: int) -> None:
    if dk % 2:
        raise HeadwiseError(f"dk={dk}: under rotary positions the shared query/key space is made of rotation "
                            f"planes, so dk must be even (e.g. {dk - 1 or 2} or {dk + 1})")
    if site.q.bias is not None or site.k.bias is not None:
        raise HeadwiseError(f"{site.name}: the query/key biases of a rotary model become position-dependent score "
                            "terms that shared rotation planes cannot keep; collaborative heads support rotary "
                            "models without attention biases (Llama, Mistral)")


def _count(site: AttentionSite, rank: int) -> tuple[int, int]:
    """Query/key parameters before (weights and biases, grouped keys counted once) and after."""
    H, D = site.num_heads, site.hidden_size
    before = sum(t.numel() for t in (site.q.weight, site.k.weight, site.q.bias, site.k.bias) if t is not None)
    if site.positions == "rotary":  # no content bias
        return before, 2 * D * rank + H * rank
    # a fused q/k/v projection (GPT-2) keeps a query bias of width rank
    return before, 2 * D * rank + H * rank + H * D + (rank if site.layout.fused_qkv else 0)


def content_bias(site: AttentionSite) -> torch.Tensor:
    """``c_h = W_k^hᵀ b_q^h`` ``[H, D]``: the key-dependent score term of the biases (the rest cancels)."""
    bias = site.q.bias
    K = site.k.weight.detach().double()
    return K.new_zeros(K.shape[0], K.shape[2]) if bias is None else \
        torch.einsum("hdj,hd->hj", K, bias.detach().double())


def _decompose_sites(sites: list[AttentionSite], config: CollaborativeConfig, moments,
                     progress) -> tuple[Compression, list]:
    """Decompose every site at ``config.dk`` (the model is not changed); returns the stats and what to install."""
    exact = max(exact_rank(s) for s in sites)
    result = Compression(config.dk if isinstance(config.dk, float) else min(config.dk, exact),
                         "scores" if moments else "weights")
    if any(s.positions == "rotary" for s in sites) and (config.init == "hosvd" or config.solver != "als"):
        raise HeadwiseError(f"init={config.init!r}, solver={config.solver!r}: rotary sites are decomposed per "
                            "frequency from the block start with complex ALS; use init='auto' or 'block', solver='als'")
    plan = []
    for site in progress_bar(sites, desc=f"decomposing (dk={result.dk})", unit="site",
                             disable=None if progress is None else not progress):
        start = time.perf_counter()
        rank = site_rank(site, config.dk)
        P, K = site.q.weight.detach().float(), site.k.weight.detach().float()
        cov = moments[site.path] if moments else None
        if site.positions == "rotary":
            dec = decompose_rotary(P, K, rank, iterations=config.iterations, tol=config.tol, covariance=cov,
                                   ridge=config.ridge)
            weight_error, content = dec.device_weight_error, None
        else:
            dec = decompose(P, K, rank, init=config.init, iterations=config.iterations, tol=config.tol,
                            solver=config.solver, covariance=cov, ridge=config.ridge)
            weight_error = relative_error(P, K, dec.factors) if rank < exact_rank(site) else P.new_zeros(())
            content = content_bias(site)
        seconds = time.perf_counter() - start
        before, after = _count(site, rank)
        result.sites.append(SiteCompression(site.path, site.name, rank, weight_error,
                                            dec.device_error if cov is not None else None, before, after, seconds))
        plan.append((site, rank, dec.factors, content))
    return result, plan


def _prepare(model, dk, config, calibration, tokenizer, progress, moments):
    config = with_keywords(CollaborativeConfig, config, dk=dk)
    sites = config.sites(model)
    check_compressible(model, sites, config.dk)
    if calibration is not None and moments is None:
        moments = input_moments(model, sites, calibration, tokenizer, config.batch_size, config.max_length, progress)
    return config, sites, moments


def compress(model: nn.Module, dk: int | None = None, config: CollaborativeConfig | None = None,
             calibration: Sequence[str] | Iterable[dict] | None = None, tokenizer: Any = None,
             progress: bool | None = None,
             moments: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None) -> Compression:
    """Make every attention site of ``model`` collaborative with a shared query/key width ``dk`` (in place):
    a count, or a fraction ``0 < dk < 1`` of each site's heads × head_dim (``dk=0.25`` after uneven pruning
    gives each layer a quarter of what it kept).

    ``calibration`` (texts with ``tokenizer``, or model-input dicts) selects the data-aware objective: the error of
    the attention scores on those inputs instead of the weights. ``dk ≥ H·d`` is exact (a larger ``dk`` warns and
    uses ``H·d``). ``moments`` (from ``input_moments``) reuses calibration statistics across several calls.
    Everything is checked and decomposed before the model changes, so an error leaves it untouched.
    The edit is recorded in ``config.headwise``: ``headwise.save_pretrained`` / ``from_pretrained`` round-trip it.
    """
    config = with_keywords(CollaborativeConfig, config, dk=dk)
    sites = config.sites(model)
    refuse_offloaded(sites, "collaborative")
    check_compressible(model, sites, config.dk)
    exact = max(exact_rank(s) for s in sites)
    if isinstance(config.dk, int) and config.dk > exact:
        warnings.warn(f"dk={config.dk} is more than the exact form needs ({exact} = heads × head_dim); using the "
                      f"exact form, dk={exact}", stacklevel=2)
    if moments is not None or calibration is None:
        groups = iter([(sites, moments)])
    else:  # a group of sites at a time: every site's moments at once would take a third of the weights' bytes
        groups = input_moments_in_groups(model, sites, calibration, tokenizer, config.batch_size, config.max_length,
                                         progress)
    done, plan = [], []
    for group, found in groups:
        part, built = _decompose_sites(group, config, found, progress)
        done, plan = done + part.sites, plan + built
    result = Compression(config.dk if isinstance(config.dk, float) else min(config.dk, exact), part.objective, done)
    for site, rank, factors, content in plan:
        install(site, rank, factors, content)
    record(model, "collaborative", config, {"dk": {s.path: s.dk for s in result.sites}})
    return result


def tradeoff(model: nn.Module, dks: Sequence[int], config: CollaborativeConfig | None = None,
             calibration: Sequence[str] | Iterable[dict] | None = None, tokenizer: Any = None,
             moments: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None) -> list[Compression]:
    """What ``compress`` would give at each of ``dks`` (errors, parameters), without changing the model."""
    if not dks:
        return []
    first = CollaborativeConfig(dk=dks[0]) if config is None else replace(config, dk=dks[0])
    config, sites, moments = _prepare(model, None, first, calibration, tokenizer, False, moments)
    for dk in dks:
        check_compressible(model, sites, dk)
    return [_decompose_sites(sites, replace(config, dk=dk), moments, False)[0] for dk in dks]


def replay_collaborative(model: nn.Module, entry: dict) -> None:
    """Make the sites a journal entry lists collaborative (``state["dk"]``: ``{site path: shared width}``)."""
    by_path = recorded_sites(model, entry["state"]["dk"], "the checkpoint's collaborative entry")
    for path, rank in entry["state"]["dk"].items():
        install(by_path[path], int(rank))
