"""Plan edits for tests, written short: ``edit(prune={...}, kv_heads=1, latent=0.5, dk=0.5,
local=(3, ["dec-self.1"]), quantization={...})`` is the ``Edit`` of the matching method configs."""

from headwise.collaborative import CollaborativeConfig
from headwise.contract import Selection
from headwise.conversion import GQAConfig, LatentConfig
from headwise.mechanisms.method import ReplaceConfig
from headwise.planning.edits import Edit
from headwise.pruning.method import PruneHeadsConfig
from headwise.quantization import QuantizationConfig


def edit(prune=None, kv_heads=None, latent=None, dk=None, local=None, quantization=None) -> Edit:
    configs = []
    if prune:
        configs.append(PruneHeadsConfig(prune))
    if kv_heads:
        configs.append(GQAConfig(kv_heads=kv_heads))
    if latent:
        configs.append(LatentConfig(kv_budget=latent))
    if dk:
        configs.append(CollaborativeConfig(dk=dk))
    if local:
        window, sites = local
        configs.append(ReplaceConfig("local", {"window": window}, selection=Selection(names=tuple(sites))))
    if quantization:
        configs.append(QuantizationConfig(**quantization))
    return Edit(tuple(configs))
