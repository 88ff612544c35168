"""Run under ``torchrun --nproc_per_node 2``: a few L0 training steps of MiniLM on STS-B train; each rank writes
its gate parameters to ``$OUT/rank<r>.pt``."""

import os
import sys

import torch

import headwise
from headwise.pruning import L0Config, L0Penalty, L0Training, add_l0_gates, l0_gates
from headwise.training import finetune_stsb

out = sys.argv[1]
model, tokenizer = headwise.load_model()
add_l0_gates(model, L0Config(init=0.5))
penalty = L0Penalty(model, L0Training(lam=0.05, target_heads=36))
finetune_stsb(model, tokenizer, max_steps=3, batch_size=4, limit=48, penalties=[penalty],
              head_learning_rate=0.1, progress=False, gradient_accumulation_steps=2)
rank = int(os.environ["RANK"])
torch.save({p: g.log_alpha.detach().clone() for p, g in l0_gates(model).items()}, f"{out}/rank{rank}.pt")
