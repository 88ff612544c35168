"""lm-evaluation-harness over headwise models: the model type ``headwise``.

lm-eval 0.4 finds model types only in its own table (no entry points), so its stock ``lm_eval`` command cannot see
a plug-in. Two ways in, both registering ``headwise`` first:

- ``python -m headwise.clients.lm_eval --model headwise --model_args pretrained=PATH --tasks ...``: lm-eval's own
  command line, unchanged, with the ``headwise`` model type known;
- in Python, ``import headwise.clients.lm_eval`` then ``lm_eval.simple_evaluate(model="headwise", ...)``.

``pretrained`` is anything ``headwise.load_model`` takes: a folder headwise wrote (pruned, KV policy, latent, …),
a plain folder, a named model (``smollm2-135m``) or a hub name. The model is lm-eval's HF model over the loaded
one, with one difference: log-likelihoods of a model carrying a KV policy are scored through the policy's cache
(``kvcache.policy_forward``: every query keeps only what its head's rule keeps, as ``headwise eval lm`` measures),
not by a full forward that attends to every token; generation uses the policy through ``generate()``.

(The stock command also loads a sealed folder with ``--model hf --model_args pretrained=PATH,trust_remote_code=True``
through ``headwise.clients.auto``, but scores a KV policy's log-likelihoods over the full cache.)
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from ..errors import HeadwiseError

NAME = "headwise"
BACKENDS = {"lm": "causal", "translation": "seq2seq"}  # headwise task of the model's head -> lm-eval backend


@register_model(NAME)
class HeadwiseLM(HFLM):
    """lm-eval's HF model over ``headwise.load_model(pretrained)`` (see the module docstring). ``device``,
    ``dtype``, ``batch_size`` and ``max_length`` as for ``--model hf``; other ``--model_args`` are refused."""

    def __init__(self, pretrained: str, device: str | None = "cpu", dtype: str | None = None,
                 batch_size: int | str | None = 1, max_length: int | None = None, **kwargs: Any) -> None:
        from ..models import load_model, native_task

        backend = BACKENDS.get(native_task(pretrained))
        if backend is None:
            raise HeadwiseError(f"lm-eval scores language models: {pretrained} holds no causal LM or encoder-decoder "
                                "head; save the model with its LM head (the task lm or translation)")
        model, tokenizer = load_model(pretrained, device=device or "cpu", dtype=None if dtype == "auto" else dtype,
                                      task={v: k for k, v in BACKENDS.items()}[backend])
        super().__init__(pretrained=model, tokenizer=tokenizer, backend=backend, batch_size=batch_size,
                         max_length=max_length, **kwargs)

    def _model_call(self, inps: torch.Tensor, attn_mask: torch.Tensor | None = None,
                    labels: torch.Tensor | None = None) -> torch.Tensor:
        """The logits ``[B, T, V]`` of a batch, through the model's KV policy when it carries one."""
        from ..kvcache import policy_forward, policy_of

        with policy_forward(self.model) if policy_of(self.model) is not None else nullcontext():
            return super()._model_call(inps, attn_mask, labels)


def main() -> None:
    """lm-eval's command line with the ``headwise`` model type registered."""
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
