"""Tiny random-initialised models of every supported family, and inputs with padding."""

from __future__ import annotations

import torch
import transformers as tf

VOCAB = 97


def _cfg(family: str):
    common = dict(vocab_size=VOCAB)
    if family == "bert":
        return tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, **common)
    if family == "roberta":
        return tf.RobertaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                                pad_token_id=1, **common)
    if family == "xlm-roberta":
        return tf.XLMRobertaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                                   pad_token_id=1, **common)
    if family == "electra":
        return tf.ElectraConfig(hidden_size=32, embedding_size=16, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=37, **common)
    if family == "distilbert":
        return tf.DistilBertConfig(dim=32, n_layers=2, n_heads=4, hidden_dim=37, **common)
    if family == "albert":
        return tf.AlbertConfig(hidden_size=32, embedding_size=16, num_hidden_layers=3, num_attention_heads=4,
                               intermediate_size=37, **common)
    if family == "gpt2":
        return tf.GPT2Config(n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0, **common)
    if family == "llama":
        return tf.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                              intermediate_size=37, **common)
    if family == "mistral":
        return tf.MistralConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                intermediate_size=37, sliding_window=None, **common)
    if family == "qwen2":
        return tf.Qwen2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                              intermediate_size=37, **common)
    if family == "vit":
        return tf.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                            image_size=16, patch_size=4)
    raise KeyError(family)


FAMILIES = ["bert", "roberta", "xlm-roberta", "electra", "distilbert", "albert", "gpt2", "llama", "mistral", "qwen2",
            "vit"]
CAUSAL = {"gpt2", "llama", "mistral", "qwen2"}


def tiny_model(family: str, attn: str = "headwise", seed: int = 0):
    """A random-initialised base model of ``family`` in eval mode."""
    torch.manual_seed(seed)
    return tf.AutoModel.from_config(_cfg(family), attn_implementation=attn).eval()


def tiny_inputs(family: str, batch: int = 3, length: int = 7, seed: int = 1) -> tuple[dict, torch.Tensor]:
    """Model inputs and a ``[B, T]`` bool tensor of real (non-padded) positions.

    Row 1 is right-padded and, for causal families, row 2 is left-padded (as generation batches are).
    """
    g = torch.Generator().manual_seed(seed)
    if family == "vit":
        pixels = torch.randn(batch, 3, 16, 16, generator=g)
        return {"pixel_values": pixels}, torch.ones(batch, 17, dtype=torch.bool)
    ids = torch.randint(2, VOCAB, (batch, length), generator=g)
    real = torch.ones(batch, length, dtype=torch.bool)
    real[1, length - 3 :] = False
    if family in CAUSAL and batch > 2:
        real[2, :2] = False
    return {"input_ids": ids, "attention_mask": real.long()}, real


class RandomPairs(torch.utils.data.Dataset):
    """``n`` random token-id sentence pairs of ``length`` tokens with random labels, in the
    ``CosineRegression`` input format (for Trainer tests on tiny models)."""

    def __init__(self, n: int = 8, length: int = 6) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(2, 90, (n, 2, length), generator=g)
        self.labels = torch.rand(n, generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        mask = torch.ones_like(self.ids[i, 0])
        return {"input_ids_a": self.ids[i, 0], "attention_mask_a": mask, "input_ids_b": self.ids[i, 1],
                "attention_mask_b": mask, "labels": self.labels[i]}
