"""The edit journal: checkpoints written by an earlier format keep loading, and what they load computes what the
saved model computed.

``tests/data/checkpoints_v1`` holds tiny checkpoints written by headwise at commit ecf0f5c (journal format 1:
``{"kind": ...}`` edit records), each with ``expected.safetensors``: the inputs and the outputs the model gave
right before it was saved (``last_hidden_state``, or ``logits`` for the encoder-decoder)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import headwise

V1 = Path(__file__).resolve().parent / "data" / "checkpoints_v1"
CHECKPOINTS = sorted(p.name for p in V1.iterdir())


def _outputs(model, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        result = model(**inputs)
    return result.logits if "decoder_input_ids" in inputs else result.last_hidden_state


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_format_1_checkpoint_reloads_to_the_saved_outputs(name):
    stored = load_file(V1 / name / "expected.safetensors")
    expected = stored.pop("expected")
    model = headwise.from_pretrained(V1 / name)
    torch.testing.assert_close(_outputs(model, stored), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_format_1_checkpoint_saved_again_reloads_the_same(name, tmp_path):
    stored = load_file(V1 / name / "expected.safetensors")
    expected = stored.pop("expected")
    headwise.save_pretrained(headwise.from_pretrained(V1 / name), tmp_path / "again")
    torch.testing.assert_close(_outputs(headwise.from_pretrained(tmp_path / "again"), stored), expected,
                               rtol=1e-5, atol=1e-5)


def test_format_1_kv_policy_is_back():
    model = headwise.from_pretrained(V1 / "llama-latent-kvpolicy")
    assert headwise.kvcache.policy_of(model) is not None
