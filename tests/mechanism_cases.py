"""Every registered mechanism with each of its options, at sizes small enough that all of them approximate."""

import torch

from headwise.mechanisms import MECHANISMS

H, D = 2, 8
T2D = 1 + 4 * 5  # local2d: [CLS] + a 5 × 4 grid
CASES = [
    ("softmax", {}),
    ("linear", {}), ("linear", {"feature_map": "relu"}), ("linear", {"feature_map": "dpfp", "dpfp_nu": 2}),
    ("cosformer", {"max_length": 40}),
    ("local", {"window": 3}), ("local", {"window": 3, "rel_pos_bias": True}), ("local", {"window": 3, "mode": "block"}),
    ("local", {"window": 4, "mode": "block", "overlap": 2, "rel_pos_bias": True}),
    ("performer", {"features": 16}), ("performer", {"features": 16, "learn_features": True}),
    ("rfa", {"features": 16}),
    ("scatterbrain", {"window": 3, "features": 16}), ("scatterbrain", {"window": 3, "features": 16, "mode": "sliding"}),
    ("eva", {"window": 4, "chunk_size": 2}), ("eva", {"window": 4, "chunk_size": 2, "proposal": "uniform"}),
    ("eva", {"window": 4, "chunk_size": 2, "proposal": "key"}),
    ("eva-paper", {"window": 4, "num_landmarks": 5}),
    ("eva-paper", {"window": 4, "overlap": 2, "num_landmarks": 5, "adaptive": "mean"}),
    ("eva-paper", {"window": 2, "num_landmarks": 4, "grid": 7, "adaptive": "no-ln"}),
    ("eva-paper", {"window": 4, "chunk_size": 2, "num_landmarks": 5, "adaptive": "none"}),
    ("nystrom", {"landmarks": 4}),
    ("local2d", {"window": 2, "grid": 4, "prefix_tokens": 1}),
    ("lara", {"num_landmarks": 4}), ("lara", {"num_landmarks": 4, "mis": "bh"}),
    ("lara", {"num_landmarks": 4, "proposal": "learned"}),
    ("ra", {}),
]
CAUSAL_CASES = [(n, a) for n, a in CASES if MECHANISMS[n].can_be_causal and not (n == "eva-paper" and a.get("grid"))]


def case_id(case):
    name, args = case
    return name + "".join(f"-{k}={v}" for k, v in args.items())


def length(name):
    return T2D if name == "local2d" else 21


def qkv(t=21, b=2, seed=0, s=1.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(b, H, t, D, generator=g) * s).to(dtype) for _ in range(3)]
