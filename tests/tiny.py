"""Tiny random-initialised models of every supported family, inputs with padding, and a test penalty."""

from __future__ import annotations

import torch
import transformers as tf

import headwise.runtime  # noqa: F401  (registers the "headwise" attention implementation these models are built with)

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
    """``n`` random token-id sentence pairs of ``length`` tokens with random scores, in the ``stsb`` task's batch
    format (``TaskObjective(get_task("stsb"), encoder)``, for Trainer tests on tiny models)."""

    def __init__(self, n: int = 8, length: int = 6) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(2, 90, (n, 2, length), generator=g)
        self.labels = torch.rand(n, generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        mask = torch.ones_like(self.ids[i, 0])
        return {"input_ids_a": self.ids[i, 0], "attention_mask_a": mask, "input_ids_b": self.ids[i, 1],
                "attention_mask_b": mask, "score": self.labels[i]}


# --- encoder-decoder families -------------------------------------------------------------------------------

SEQ2SEQ = ["bart", "marian", "t5"]
PAD = 1  # pad id of the tiny BART/Marian configs (T5 pads with 0)


def seq2seq_config(family: str, **overrides):
    """Tiny ``family`` config; ``overrides`` change fields (e.g. ``decoder_attention_heads=2`` for BART)."""
    if family in ("bart", "marian"):
        cls = tf.BartConfig if family == "bart" else tf.MarianConfig
        fields = dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                      decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=64,
                      pad_token_id=PAD, bos_token_id=0, eos_token_id=2, decoder_start_token_id=PAD if family == "marian"
                      else 2, forced_eos_token_id=None, dropout=0.0, attention_dropout=0.0)
        return cls(**(fields | overrides))
    if family == "t5":
        fields = dict(vocab_size=VOCAB, d_model=32, d_kv=6, num_heads=4, num_layers=2, num_decoder_layers=2, d_ff=37,
                      relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
                      pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
        return tf.T5Config(**(fields | overrides))
    raise KeyError(family)


def tiny_seq2seq(family: str, attn: str = "headwise", seed: int = 0, **overrides):
    """A random-initialised ``…ForConditionalGeneration`` of ``family`` in eval mode."""
    torch.manual_seed(seed)
    config = seq2seq_config(family, **overrides)
    model = tf.AutoModelForSeq2SeqLM.from_config(config, attn_implementation=attn).eval()
    # Default inits give near-uniform maps and input-blind generations; these do not. A random T5 otherwise
    # repeats one token per sentence: its embeddings are kept small and its feed-forward weights large.
    embedding_std, ff_gain = (0.1, 3.0) if family == "t5" else (1.0, 1.0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight", ".q.weight", ".k.weight")):
                p.normal_(0.0, 0.3)
            elif "embed" in name or "shared" in name:
                p.normal_(0.0, embedding_std)
            elif p.dim() == 2:
                p.normal_(0.0, p.shape[1] ** -0.5 * (ff_gain if "DenseReluDense" in name else 1.0))
    return model


def seq2seq_inputs(family: str, batch: int = 3, src_len: int = 7, tgt_len: int = 5,
                   seed: int = 1) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Inputs with padding on both sides, plus the ``[B, S]`` and ``[B, T]`` bool masks of real positions.

    Source: row 1 right-padded, row 2 left-padded. Target: row 2 right-padded, row 0 left-padded.
    """
    g = torch.Generator().manual_seed(seed)
    pad = 0 if family == "t5" else PAD
    src = torch.randint(3, VOCAB, (batch, src_len), generator=g)
    tgt = torch.randint(3, VOCAB, (batch, tgt_len), generator=g)
    src_real = torch.ones(batch, src_len, dtype=torch.bool)
    tgt_real = torch.ones(batch, tgt_len, dtype=torch.bool)
    src_real[1, src_len - 3:] = False
    src_real[2, :2] = False
    tgt_real[2, tgt_len - 2:] = False
    tgt_real[0, :1] = False
    inputs = {"input_ids": src.masked_fill(~src_real, pad), "attention_mask": src_real.long(),
              "decoder_input_ids": tgt.masked_fill(~tgt_real, pad), "decoder_attention_mask": tgt_real.long()}
    return inputs, src_real, tgt_real


class GateSum:
    """A penalty that must count once per update: 0.3 · Σ gate weights."""

    def __init__(self, gates):
        self.gates = list(gates.values())

    def __call__(self, model):
        return 0.3 * sum(g.weight.sum() for g in self.gates)

    def metrics(self):
        return {"gate_sum": float(sum(g.weight.detach().sum() for g in self.gates))}

    def step(self):
        pass
