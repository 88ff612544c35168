"""A pruned encoder's ``plain/`` export, through ONNX, gives the pruned model's outputs (issue 53).

Two environments, because optimum's ONNX exporter does not install beside transformers 5 (optimum-onnx 0.1.0 pins
transformers < 4.58):

1. headwise's venv: prune MiniLM (uneven heads per layer), export ``plain/`` (removed heads zero-padded back to the
   config's head counts) and record the pruned model's last hidden states on real STS-B sentences::

       python experiments/onnx_export.py prepare --out /tmp/onnx-check

2. a separate venv with optimum-onnx and onnxruntime (not a headwise dependency)::

       python -m venv /tmp/onnx-venv && /tmp/onnx-venv/bin/pip install torch optimum-onnx onnxruntime
       /tmp/onnx-venv/bin/optimum-cli export onnx --model /tmp/onnx-check/plain --task feature-extraction \
           /tmp/onnx-check/onnx
       /tmp/onnx-venv/bin/python experiments/onnx_export.py check --out /tmp/onnx-check

``check`` runs the ONNX graph with onnxruntime on the same inputs and prints the largest absolute difference from
the pruned model's outputs (it imports only numpy, onnxruntime and the JSON/NPZ files ``prepare`` wrote).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def prepare(out: Path) -> None:
    import numpy as np
    import torch

    import headwise
    from headwise.io.plain import export_plain
    from headwise.tasks.stsb_data import read_stsb

    model, tokenizer = headwise.load_model("minilm")
    heads = {f"enc-self.{i}": list(range(i + 1)) for i in range(6)}  # layer i loses its first i + 1 heads
    headwise.prune_heads(model, heads)
    export_plain(model, out / "plain", tokenizer=tokenizer, overwrite=True)
    texts = list(read_stsb("dev").first[:16])
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    np.savez(out / "reference.npz", input_ids=batch["input_ids"].numpy(), attention_mask=batch["attention_mask"].numpy(),
             token_type_ids=batch["token_type_ids"].numpy(), hidden=hidden.numpy())
    print(json.dumps({"pruned": {k: len(v) for k, v in heads.items()}, "texts": len(texts),
                      "plain": str(out / "plain")}))


def check(out: Path) -> None:
    import numpy as np
    import onnxruntime

    ref = np.load(out / "reference.npz")
    session = onnxruntime.InferenceSession(str(out / "onnx" / "model.onnx"))
    names = {i.name for i in session.get_inputs()}
    feed = {k: ref[k].astype(np.int64) for k in ("input_ids", "attention_mask", "token_type_ids") if k in names}
    hidden = session.run(None, feed)[0]
    keep = ref["attention_mask"].astype(bool)
    diff = float(np.abs(hidden - ref["hidden"])[keep].max())
    print(json.dumps({"onnxruntime": onnxruntime.__version__, "max_abs_diff": diff,
                      "scale": float(np.abs(ref["hidden"][keep]).max())}))
    sys.exit(0 if diff < 1e-4 else 1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("prepare", "check"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    (prepare if args.step == "prepare" else check)(args.out)
