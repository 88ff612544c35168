import pytest
import torch

import headwise
from headwise.analysis import gradient_importance
from headwise.pruning import importance_pruning, keep_counts, site_importance
from headwise.runtime.ops import detach
from headwise.sites import find_sites

TEXTS = ["A man is playing a guitar.", "The cat sat on the mat.", "Stocks fell sharply on Monday.",
         "Two dogs run through a field.", "She is reading a book in the park.", "A plane is taking off."]


@pytest.fixture
def fresh(minilm):
    model, tokenizer = minilm
    yield model, tokenizer
    for site in find_sites(model):
        detach(site, "mask")


def _open(model):
    return sum(int(op.mask.sum()) for s in find_sites(model) for op in [s.module.headwise.output["mask"]])


def test_one_shot_masks_the_least_important_heads(fresh):
    model, tokenizer = fresh
    scores = site_importance(model, gradient_importance(model, tokenizer, TEXTS, progress=False))
    curve = importance_pruning(model, tokenizer, TEXTS, keep=[72, 62], metric=_open, progress=False)
    assert [(s.kept, s.metric) for s in curve.steps] == [(72, 72.0), (62, 62.0)]
    flat = torch.cat([scores[s.path] for s in find_sites(model)])
    removed = torch.cat([1 - torch.tensor(curve.steps[-1].masks[s.path]) for s in find_sites(model)]).bool()
    assert flat[removed].max() <= flat[~removed].min()  # the 10 removed are the 10 lowest


def test_iterative_recomputes_under_the_mask_and_stops_at_the_floor(fresh):
    model, tokenizer = fresh
    curve = importance_pruning(model, tokenizer, TEXTS, keep=keep_counts(72, 12, 0.25), iterative=True,
                               metric=_open, floor=40, progress=False)
    assert [s.kept for s in curve.steps] == [72, 54, 36]  # 36 < 40: stop
    assert all(sum(map(sum, s.masks.values())) == s.kept for s in curve.steps)
    assert all(sum(m) >= 1 for m in curve.steps[-1].masks.values())  # at least one head per site


def test_bad_schedules(fresh):
    model, tokenizer = fresh
    with pytest.raises(headwise.HeadwiseError, match="between 6"):
        importance_pruning(model, tokenizer, TEXTS, keep=[3])
    with pytest.raises(headwise.HeadwiseError, match="needs a metric"):
        importance_pruning(model, tokenizer, TEXTS, keep=[60], floor=80)
    with pytest.raises(headwise.HeadwiseError, match="fraction"):
        keep_counts(72, 7, 1.5)
