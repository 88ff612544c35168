"""``ProbRows``: observers that take rows get the eager maps by query rows while the module runs SDPA; inactive
observers are skipped and need no probabilities."""

import pytest
import torch
from tiny import seq2seq_inputs, tiny_inputs, tiny_model, tiny_seq2seq

from headwise.runtime import add_observer
from headwise.runtime.probs import ProbRows
from headwise.sites import find_sites


class Rows:
    """An observer taking a ``ProbRows``: gathers its rows three at a time, and its masks."""

    takes_rows = True

    def __init__(self, seen: list) -> None:
        self.seen = seen

    def __call__(self, probs, keep, out):
        assert isinstance(probs, ProbRows) and keep is None
        T = probs.shape[2]
        spans = [(q0, min(T, q0 + 3)) for q0 in range(0, T, 3)]
        chunked = torch.cat([probs.rows(*span) for span in spans], 2)
        self.seen.append((chunked, probs.full(), [(span, probs.keep(*span)) for span in spans], out))


def _run(model, inputs, observer):
    for site in find_sites(model):
        add_observer(site, "probe", observer)
    with torch.no_grad():
        return model(**inputs)


CASES = {  # (model, inputs, real positions of the output)
    "llama": lambda: (tiny_model("llama"), *tiny_inputs("llama")),  # GQA, causal, right and left padding
    "bert": lambda: (tiny_model("bert"), *tiny_inputs("bert")),  # padding, not causal
    "gpt2-unpadded": lambda: (tiny_model("gpt2"), {"input_ids": tiny_inputs("gpt2")[0]["input_ids"]},
                              torch.ones(3, 7, dtype=torch.bool)),  # no mask at all
    "t5": lambda: (tiny_seq2seq("t5"), *seq2seq_inputs("t5")[::2]),  # position bias; cross-attention Tq != Tk
}


@pytest.mark.parametrize("case", list(CASES))
def test_prob_rows_are_the_eager_maps(case):
    """Rows three at a time, ``full()`` and the rows' masks equal the explicit softmax's maps and mask; the SDPA
    output equals its output (rows that see no key at all excepted: undefined in both)."""
    model, inputs, real = CASES[case]()
    eager, lazy = [], []
    ref = _run(model, inputs, lambda probs, keep, out: eager.append((probs, keep, out)))
    for site in find_sites(model):
        site.module.headwise.observers.clear()
    got = _run(model, inputs, Rows(lazy))
    hidden = "last_hidden_state" if hasattr(ref, "last_hidden_state") else "logits"
    torch.testing.assert_close(got[hidden][real], ref[hidden][real], atol=1e-5, rtol=0)
    assert len(eager) == len(lazy) > 0
    for (probs, keep, out), (chunked, full, masks, sdpa_out) in zip(eager, lazy):
        # later layers' inputs differ by the SDPA outputs' rounding: 1e-5 (T5's loud maps)
        torch.testing.assert_close(chunked, probs, atol=1e-5, rtol=0)
        torch.testing.assert_close(full, probs, atol=1e-5, rtol=0)
        seeing = (torch.ones(out.shape[:2], dtype=torch.bool) if keep is None  # [B, Tq]: rows that see a key
                  else keep.any(-1).all(1).expand(out.shape[:2]))
        torch.testing.assert_close(sdpa_out[seeing], out[seeing], atol=1e-5, rtol=1e-5)
        for (q0, q1), rows in masks:
            if keep is None:
                assert rows is None
            else:
                shape = (*keep.shape[:2], q1 - q0, keep.shape[3])
                assert torch.equal(rows.expand(shape), keep[:, :, q0:q1].expand(shape))


def test_observers_choose_the_path_and_inactive_ones_are_skipped(monkeypatch):
    """An observer taking rows keeps SDPA (no explicit softmax) and gets a ``ProbRows``; a plain one gets the
    explicit softmax's maps. Inactive, neither is called and the path stays (a recomputed block must run the graph
    its forward ran)."""
    import headwise.runtime.attention as attention

    model, inputs, _ = CASES["llama"]()
    eager_calls, calls = [], []
    plain = attention.softmax_attention
    monkeypatch.setattr(attention, "softmax_attention", lambda *a, **k: eager_calls.append(1) or plain(*a, **k))

    class Observer:
        active, takes_rows = True, True

        def __call__(self, probs, keep, out):
            calls.append(type(probs))

    observer = Observer()
    for active, takes_rows, called, eager in [(True, True, ProbRows, False), (False, True, None, False),
                                              (True, False, torch.Tensor, True), (False, False, None, True)]:
        calls.clear(), eager_calls.clear()
        observer.active, observer.takes_rows = active, takes_rows
        _run(model, inputs, observer)
        assert calls == ([called] * 2 if called else []) and len(eager_calls) == (2 if eager else 0)
