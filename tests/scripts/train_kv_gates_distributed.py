"""Run under ``torchrun --nproc_per_node 2``: a few KV-gate training steps of a tiny Qwen2 (GQA) through the shared
Trainer; each rank writes its ``α`` to ``$OUT/rank<r>.pt``."""

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_kvcache_scores import char_tokenizer, tiny_lm  # noqa: E402

from headwise.kvcache import KVGateConfig  # noqa: E402
from headwise.training import train_kv_gates  # noqa: E402

model, tokenizer = tiny_lm(), char_tokenizer()
learned = train_kv_gates(model, tokenizer, KVGateConfig(steps=3, lr=0.05, length=160, sink=2, window=16),
                         progress=False)
torch.save(learned.alpha, f"{sys.argv[1]}/rank{os.environ['RANK']}.pt")
