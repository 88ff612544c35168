from pathlib import Path

import pytest
import torch
import transformers as tf
from tiny import GateSum, RandomPairs
from two_processes import torchrun_two

from headwise.runtime import add_gates, enable
from headwise.tasks import TaskObjective, get_task
from headwise.training import HeadwiseTrainer, is_head_parameter


def _train(tmp_path, batch, accumulation, head_lr=None):
    torch.manual_seed(0)
    cfg = tf.BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    encoder = enable(tf.BertModel(cfg, add_pooling_layer=False))
    gates = add_gates(encoder)
    args = tf.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=batch, max_steps=1,
                                gradient_accumulation_steps=accumulation, learning_rate=0.1, optim="sgd",
                                lr_scheduler_type="constant", max_grad_norm=0.0, report_to="none", save_strategy="no", use_cpu=True,
                                remove_unused_columns=False, disable_tqdm=True, data_seed=0, seed=0)
    trainer = HeadwiseTrainer(model=TaskObjective(get_task("stsb"), encoder), args=args, train_dataset=RandomPairs(8),
                              penalties=[GateSum(gates)], head_learning_rate=head_lr)
    trainer._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(trainer.train_dataset)
    trainer.train()
    return encoder, gates, trainer


def test_gradient_accumulation_matches_one_big_batch(tmp_path):
    big, big_gates, _ = _train(tmp_path / "a", batch=8, accumulation=1)
    acc, acc_gates, _ = _train(tmp_path / "b", batch=4, accumulation=2)
    for (name, p), q in zip(big.named_parameters(), acc.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5, msg=name)
    # the penalty gradient is 0.3 per gate weight: one SGD step at lr 0.1 moves it by 0.03 plus the task part
    untouched = torch.ones(4)
    assert all(not torch.allclose(g.weight, untouched) for g in big_gates.values())


def test_head_parameters_get_their_own_learning_rate(tmp_path):
    _, _, trainer = _train(tmp_path, batch=8, accumulation=1, head_lr=0.5)
    groups = trainer.optimizer.param_groups
    head = [g for g in groups if g["lr"] == 0.5]
    assert len(head) == 1 and len(head[0]["params"]) == 2 and head[0]["weight_decay"] == 0.0
    assert all(g["lr"] == 0.1 for g in groups if g is not head[0])
    assert is_head_parameter("encoder.layer.0.attention.self.headwise.output.gate.weight")
    assert not is_head_parameter("encoder.layer.0.attention.self.query.weight")


@pytest.mark.slow
def test_two_process_training_keeps_gates_identical(tmp_path):
    torchrun_two(Path(__file__).parent / "scripts" / "train_l0_distributed.py", tmp_path, port=29533)
    a, b = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert a.keys() == b.keys() and len(a) == 6
    for path in a:
        assert torch.equal(a[path], b[path]), path
        assert not torch.allclose(a[path], torch.full_like(a[path], 0.5))  # the gates did train
