"""Recovery with distillation: the losses against hand-computed references (masking, precisions, meta device),
the objective on tiny models of each task kind (zero when student == teacher, gradients only in the student) and
``headwise.recover``'s modes and bad input."""

import copy
import gzip
import math

import pytest
import torch
import transformers as tf

import headwise
from headwise.errors import HeadwiseError
from headwise.tasks import (Classification, LanguageModeling, Stsb, TaskOutputs, Translation, collate,
                            distillation_loss, embedding_distillation, logit_distillation, train_tokenizer)
from headwise.training import DistillationObjective
from headwise.training.recipes import l0_prune
from tiny import VOCAB, tiny_seq2seq

WORDS = "the a cat dog sat on mat ran to house big small red blue tree sun".split()


def sentence(i: int, n: int = 5) -> str:
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n + i % 3))


# ---- the losses against hand computations --------------------------------------------------------------------

def reference_kl(student: list[float], teacher: list[float], temperature: float) -> float:
    """T² · Σ p_t (log p_t − log p_s), with plain-Python softmaxes."""
    def softmax(x):
        e = [math.exp(v / temperature) for v in x]
        return [v / sum(e) for v in e]

    p_s, p_t = softmax(student), softmax(teacher)
    return temperature**2 * sum(t * (math.log(t) - math.log(s)) for s, t in zip(p_s, p_t))


def test_kl_distillation_matches_a_hand_computation():
    # p_t = (3/4, 1/4), p_s = (1/2, 1/2) at T = 1: KL = 3/4 ln(3/2) + 1/4 ln(1/2)
    got = logit_distillation(torch.tensor([[0.0, 0.0]]), torch.tensor([[math.log(3), 0.0]]), temperature=1.0)
    assert got.item() == pytest.approx(0.75 * math.log(1.5) + 0.25 * math.log(0.5), rel=1e-6)
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(2, 3, 5, generator=g), torch.randn(2, 3, 5, generator=g)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    for temperature in (1.0, 2.0, 4.0):
        got = logit_distillation(s, t, mask, temperature)
        for b in range(2):
            kept = [reference_kl(s[b, i].tolist(), t[b, i].tolist(), temperature) for i in range(3) if mask[b, i]]
            assert got[b].item() == pytest.approx(sum(kept) / len(kept), rel=1e-5)


def test_masked_positions_do_not_count():
    g = torch.Generator().manual_seed(1)
    s, t = torch.randn(2, 4, 6, generator=g), torch.randn(2, 4, 6, generator=g)
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    changed = s.clone()
    changed[~mask] = 100 * torch.randn_like(changed[~mask])
    assert torch.equal(logit_distillation(s, t, mask), logit_distillation(changed, t, mask))
    assert torch.equal(embedding_distillation(s, t, mask), embedding_distillation(changed, t, mask))
    assert not torch.equal(logit_distillation(s, t), logit_distillation(changed, t))


def test_embedding_distillation_matches_a_hand_computation():
    s, t = torch.tensor([[[1.0, 0.0], [3.0, 4.0]]]), torch.tensor([[[0.0, 1.0], [3.0, 4.0]]])
    assert embedding_distillation(s, t, distance="mse").item() == pytest.approx((1.0 + 0.0) / 2)  # (1+1)/2, 0
    assert embedding_distillation(s, t, distance="cosine").item() == pytest.approx((1.0 + 0.0) / 2)  # 1 − 0, 1 − 1
    mask = torch.tensor([[False, True]])
    assert embedding_distillation(s, t, mask).item() == 0.0
    with pytest.raises(HeadwiseError, match="distance 'l1'"):
        embedding_distillation(s, t, distance="l1")
    with pytest.raises(HeadwiseError, match="use distance='mse'"):
        embedding_distillation(s[..., :1], t[..., :1], distance="cosine")
    with pytest.raises(HeadwiseError, match="temperature 0"):
        logit_distillation(s, t, temperature=0)


def test_zero_only_when_the_student_is_the_teacher():
    g = torch.Generator().manual_seed(2)
    t = torch.randn(3, 5, 7, generator=g)
    for kind in ("logits", "embeddings"):
        same = distillation_loss(TaskOutputs(t.clone(), kind), TaskOutputs(t, kind))
        other = distillation_loss(TaskOutputs(t + 0.1 * torch.randn(3, 5, 7, generator=g), kind), TaskOutputs(t, kind))
        assert torch.allclose(same, torch.zeros(3), atol=1e-6) and (other > 1e-4).all()
    with pytest.raises(HeadwiseError, match="teacher must be the unedited model"):
        distillation_loss(TaskOutputs(t, "logits"), TaskOutputs(t[..., :3], "logits"))


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
def test_losses_in_half_precision_match_float32(dtype, tol):
    g = torch.Generator().manual_seed(3)
    s, t = torch.randn(2, 6, 50, generator=g), torch.randn(2, 6, 50, generator=g)
    mask = torch.rand(2, 6, generator=g) > 0.3
    for fn, kw in ((logit_distillation, {"temperature": 2.0}), (embedding_distillation, {"distance": "mse"}),
                   (embedding_distillation, {"distance": "cosine"})):
        ref = fn(s, t, mask, **kw)
        got = fn(s.to(dtype), t.to(dtype), mask, **kw)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, ref, rtol=tol * 5, atol=tol)


def test_losses_on_the_meta_device():
    s, t = torch.empty(2, 6, 50, device="meta"), torch.empty(2, 6, 50, device="meta")
    mask = torch.ones(2, 6, dtype=torch.bool, device="meta")
    for out in (logit_distillation(s, t, mask, 2.0), embedding_distillation(s, t, mask, "cosine"),
                embedding_distillation(s, t, None, "mse")):
        assert out.device.type == "meta" and out.shape == (2,)


# ---- the objective on tiny models of each task kind -------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer([sentence(i) for i in range(200)], vocab_size=80, min_frequency=1)


def stsb_case(tmp_path, tokenizer):
    for name, n in (("sts-train.tsv", 24), ("sts-dev.tsv", 8)):
        rows = [f"g\tc\ty\t{i:04d}\t{(i * 1.7) % 5:.3f}\t{sentence(i)}\t{sentence(i + 3)}" for i in range(n)]
        (tmp_path / name).write_text("\n".join(rows) + "\n")
    torch.manual_seed(0)
    config = tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                           vocab_size=VOCAB, max_position_embeddings=64, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0)
    return Stsb(data=str(tmp_path)), tf.AutoModel.from_config(config, attn_implementation="headwise").eval()


def lm_case(tmp_path, tokenizer):
    (tmp_path / "text.txt").write_text("\n".join(sentence(i) for i in range(60)) + "\n")
    torch.manual_seed(0)
    config = tf.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=37, vocab_size=VOCAB, max_position_embeddings=64)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="headwise").eval()
    return LanguageModeling(data=str(tmp_path / "text.txt"), max_length=16), model


def translation_case(tmp_path, tokenizer):
    for split, n in (("train", 12), ("val", 4), ("test", 5)):
        for lang, shift in (("de", 1), ("en", 2)):
            lines = "".join(sentence(i + shift) + "\n" for i in range(n)).encode()
            (tmp_path / f"{split}.{lang}.gz").write_bytes(gzip.compress(lines))
    model = tiny_seq2seq("marian", pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         decoder_start_token_id=tokenizer.pad_token_id, dropout=0.0)
    return Translation(data_dir=str(tmp_path), split="test", max_length=32), model


def classification_case(tmp_path, tokenizer, regression=False):
    for split, n in (("train", 16), ("dev", 6)):
        label = (lambda i: f"{i * 0.3:.2f}") if regression else (lambda i: ["neg", "pos", "mid"][i % 3])
        (tmp_path / f"{split}.tsv").write_text("text\tlabel\n" + "".join(f"{sentence(i)}\t{label(i)}\n"
                                                                          for i in range(n)))
    torch.manual_seed(0)
    config = tf.BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
                           vocab_size=VOCAB, max_position_embeddings=64, num_labels=1 if regression else 3,
                           hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = tf.AutoModelForSequenceClassification.from_config(config, attn_implementation="headwise").eval()
    return Classification(data=str(tmp_path), max_length=32), model


CASES = {"stsb": stsb_case, "lm": lm_case, "translation": translation_case, "classification": classification_case,
         "regression": lambda p, t: classification_case(p, t, regression=True)}


def perturbed(model):
    student = copy.deepcopy(model)
    with torch.no_grad():
        for p in student.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return student


@pytest.mark.parametrize("case", CASES)
def test_objective_is_zero_for_the_teacher_itself_and_trains_only_the_student(case, tmp_path, tokenizer):
    task, teacher = CASES[case](tmp_path, tokenizer)
    batch = collate(task.examples(tokenizer, "train").items[:4], tokenizer.pad_token_id)
    same = DistillationObjective(task, copy.deepcopy(teacher), teacher, alpha=0.5)(**batch)
    assert same["distill_loss"].item() == pytest.approx(0.0, abs=1e-6)
    assert same["loss"].item() == pytest.approx(0.5 * same["task_loss"].item(), rel=1e-5)

    student = perturbed(teacher)
    objective = DistillationObjective(task, student, teacher, alpha=0.3, temperature=2.0)
    assert [n for n, _ in objective.named_parameters()] == [f"model.{n}" for n, _ in student.named_parameters()]
    out = objective(**batch)
    assert out["distill_loss"].item() > 1e-5
    s, t = task.outputs(student, batch), task.outputs(teacher, batch)
    ref = 0.7 * task.loss(student, batch).mean() + 0.3 * distillation_loss(s, t, temperature=2.0).mean()
    assert out["loss"].item() == pytest.approx(ref.item(), rel=1e-5)
    out["loss"].backward()
    assert all(p.grad is None for p in teacher.parameters())
    assert sum(float(p.grad.abs().sum()) for p in student.parameters() if p.grad is not None) > 0


def test_the_task_loss_is_unchanged_by_the_outputs_split(tmp_path, tokenizer):
    task, model = lm_case(tmp_path, tokenizer)
    batch = collate(task.examples(tokenizer, "train").items[:3], tokenizer.pad_token_id)
    out = task.outputs(model, batch)
    assert out.kind == "logits" and out.values.shape[:2] == out.mask.shape
    with torch.no_grad():
        for b in range(3):
            real = batch["attention_mask"][b].bool()
            expected = model(input_ids=batch["input_ids"][b:b + 1][:, real],
                             labels=batch["labels"][b:b + 1][:, real]).loss
            assert task.loss(model, batch)[b].item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lm_outputs_through_the_head_give_the_full_logit_losses_and_gradients(tmp_path, tokenizer, monkeypatch,
                                                                              dtype):
    """The lm task's outputs are hidden states + output head; its NLL and the distillation KL built in chunks of
    positions (3 positions a chunk here) equal the same losses on the whole logits, and so do their gradients."""
    from headwise.tasks import lm

    monkeypatch.setattr(lm, "LOSS_CHUNK_MIN_ROWS", 3)
    monkeypatch.setattr(lm, "LOSS_CHUNK_BYTES", 1)
    task, teacher = lm_case(tmp_path, tokenizer)
    teacher = teacher.to(dtype)
    student = perturbed(teacher)
    batch = collate(task.examples(tokenizer, "train").items[:3], tokenizer.pad_token_id)
    results = []
    for whole in (False, True):
        student.zero_grad(set_to_none=True)
        s, t = task.outputs(student, batch), task.outputs(teacher, batch)
        assert s.head is student.get_output_embeddings() and s.values.shape[-1] == 32 and s.classes == VOCAB
        if whole:  # the reference: the same outputs with their logits built whole
            s, t = TaskOutputs(s.logits(), "logits", s.mask), TaskOutputs(t.logits().detach(), "logits", t.mask)
        nll, kl = task.loss_from(s, batch), distillation_loss(s, t, temperature=2.0)
        (nll.sum() + kl.sum()).backward()
        results.append((nll.detach(), kl.detach(), {n: p.grad.clone() for n, p in student.named_parameters()}))
    (nll_c, kl_c, grads_c), (nll_w, kl_w, grads_w) = results
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(nll_c, nll_w, **tol)
    torch.testing.assert_close(kl_c, kl_w, **tol)
    assert kl_w.min() > 0 and all(p.grad is None for p in teacher.parameters())
    for name in grads_w:
        torch.testing.assert_close(grads_c[name], grads_w[name], **tol)


# ---- headwise.recover ------------------------------------------------------------------------------------------

def test_recover_distills_toward_the_teacher_and_leaves_it_alone(tmp_path, tokenizer):
    task, teacher = lm_case(tmp_path, tokenizer)
    student = perturbed(teacher)
    batch = collate(task.examples(tokenizer, "train").items, tokenizer.pad_token_id)
    state = {k: v.clone() for k, v in teacher.state_dict().items()}

    def gap():
        with torch.no_grad():
            return distillation_loss(task.outputs(student, batch), task.outputs(teacher, batch)).mean().item()

    before = gap()
    out = headwise.recover(student, tokenizer, task, teacher=teacher, alpha=1.0, max_steps=15, learning_rate=3e-3,
                           batch_size=4, progress=False)
    assert out is student and not student.training
    assert gap() < 0.7 * before
    assert all(torch.equal(v, teacher.state_dict()[k]) for k, v in state.items())


def test_recover_modes_and_bad_input(tmp_path, tokenizer):
    task, model = lm_case(tmp_path, tokenizer)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    assert headwise.recover(model, tokenizer, task, mode="none") is model
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    headwise.recover(model, tokenizer, task, mode="finetune", max_steps=2, batch_size=4, progress=False)
    assert any(not torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    with pytest.raises(HeadwiseError, match="needs teacher=.*copy.deepcopy"):
        headwise.recover(model, tokenizer, task)
    with pytest.raises(HeadwiseError, match="the teacher is the student itself"):
        headwise.recover(model, tokenizer, task, teacher=model)
    with pytest.raises(HeadwiseError, match="recovery mode 'fast'"):
        headwise.recover(model, tokenizer, task, mode="fast")
    with pytest.raises(HeadwiseError, match="alpha 2"):
        headwise.recover(model, tokenizer, task, teacher=copy.deepcopy(model), alpha=2)
    with pytest.raises(HeadwiseError, match="epochs 0"):
        headwise.recover(model, tokenizer, task, mode="finetune", epochs=0)
    base = tf.AutoModel.from_config(model.config)
    with pytest.raises(HeadwiseError, match="needs a language-modelling head"):
        headwise.recover(model, tokenizer, task, teacher=base)


def test_l0_with_distillation_keeps_the_target(tmp_path, tokenizer):
    task, teacher = stsb_case(tmp_path, tokenizer)
    student = copy.deepcopy(teacher)
    removed = l0_prune(student, tokenizer, 5, task, teacher=teacher, max_steps=4, batch_size=4, progress=False)
    assert sum(s.num_heads for s in headwise.find_sites(student)) == 5 == 8 - sum(map(len, removed.values()))
    assert sum(s.num_heads for s in headwise.find_sites(teacher)) == 8


# ---- the teacher without a copy: the student with its reversible edit switched off ------------------------------
def _reversible_edits(model):
    headwise.replace_attention(model, "local", selection=headwise.Selection(names=[headwise.find_sites(model)[0].name]),
                               window=2)
    headwise.quantize_attention(model, quantizer="lin", bits=4)


@pytest.mark.parametrize("case", ["lm", "stsb"])
def test_switched_off_teacher_gives_the_loss_and_gradients_of_a_copied_teacher(case, tmp_path, tokenizer):
    from headwise.training.recovery import has_ops, switched_off

    task, model = CASES[case](tmp_path, tokenizer)
    copied = copy.deepcopy(model)  # the teacher taken before the edit, the old way
    _reversible_edits(model)
    assert has_ops(model)
    batch = collate(task.examples(tokenizer, "train").items[:4], tokenizer.pad_token_id)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    results = []
    for teacher in (copied, "off"):
        model.zero_grad(set_to_none=True)
        out = DistillationObjective(task, model, teacher, alpha=0.7, temperature=2.0)(**batch)
        out["loss"].backward()
        results.append((out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (a, grads_a), (b, grads_b) = results
    assert a["distill_loss"].item() > 1e-8  # the edit changes the outputs: the loss is not trivially zero
    assert b["distill_loss"].item() == pytest.approx(a["distill_loss"].item(), rel=1e-4, abs=1e-10)
    assert b["loss"].item() == pytest.approx(a["loss"].item(), rel=1e-5, abs=1e-7)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 0
    assert all(torch.allclose(grads_a[n], grads_b[n], rtol=1e-4, atol=1e-7) for n in grads_a)
    # the ops are back, the model unchanged, and the teacher's forward equals the copy's
    assert has_ops(model) and all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    with switched_off(model), torch.no_grad():
        off = task.outputs(model, batch).values
    assert torch.allclose(off, task.outputs(copied, batch).values.detach(), atol=1e-5)


def test_switched_off_teacher_is_refused_without_ops_and_recovers_with_them(tmp_path, tokenizer):
    task, model = stsb_case(tmp_path, tokenizer)
    with pytest.raises(HeadwiseError, match="teacher='off'.*none"):
        headwise.recover(model, tokenizer, task, teacher="off", max_steps=1, progress=False)
    with pytest.raises(HeadwiseError, match="pass a model or 'off'"):
        DistillationObjective(task, model, "copy")
    _reversible_edits(model)
    headwise.recover(model, tokenizer, task, teacher="off", max_steps=2, batch_size=4, progress=False)
    assert not model.training and sum(1 for _ in headwise.find_sites(model)) == 2


def test_cached_teacher_gives_the_loss_and_gradients_of_a_copied_teacher(tmp_path, tokenizer):
    """After a weight-rewriting edit (GQA conversion), the teacher recorded before it (last hidden states + a copy
    of the output head) distils exactly like a copy of the whole model taken before it."""
    from headwise.training import CachedTeacher

    task, model = lm_case(tmp_path, tokenizer)
    copied = copy.deepcopy(model)  # the old way: a second model
    cached = CachedTeacher.record(model, tokenizer, task, progress=False)
    assert len(cached.hidden) == len(task.examples(tokenizer, "train"))
    headwise.convert_gqa(model, kv_heads=1, init="mean")
    batch = collate(task.examples(tokenizer, "train").items[:4], tokenizer.pad_token_id)
    results = []
    for teacher in (copied, cached):
        model.zero_grad(set_to_none=True)
        out = DistillationObjective(task, model, teacher, alpha=0.7, temperature=2.0)(**batch)
        out["loss"].backward()
        results.append((out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (a, grads_a), (b, grads_b) = results
    assert a["distill_loss"].item() > 1e-8
    assert b["distill_loss"].item() == pytest.approx(a["distill_loss"].item(), rel=1e-5)
    assert all(torch.allclose(grads_a[n], grads_b[n], rtol=1e-4, atol=1e-7) for n in grads_a)
    # training moves the student's (tied or not) output head; the cached teacher's copy stays put
    with torch.no_grad():
        model.get_output_embeddings().weight.add_(1.0)
    torch.testing.assert_close(cached.outputs(task, batch).logits(), task.outputs(copied, batch).logits())
    stranger = dict(batch, input_ids=batch["input_ids"].flip(1))
    with pytest.raises(headwise.HeadwiseError, match="did not record"):
        cached.outputs(task, stranger)
    stsb, encoder = stsb_case(tmp_path, tokenizer)
    with pytest.raises(headwise.HeadwiseError, match="serves causal LMs"):
        CachedTeacher.record(encoder, tokenizer, stsb)


# ---- memory="bounded": blocks recomputed, each parameter updated in the backward ---------------------------------
def test_backward_step_matches_the_optimizer_step_with_tied_weights_and_a_schedule():
    """AdamW run in the backward (one parameter at a time, gradients freed) gives bit for bit the weights of AdamW
    stepped after the backward, a tied weight and a learning-rate schedule included; removing it restores a plain
    optimizer."""
    from headwise.training.backward_step import step_in_backward

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 6), torch.nn.Tanh(), torch.nn.Linear(6, 11))
    model[2].weight = model[0].weight  # tied, used twice in one backward
    reference = copy.deepcopy(model)
    x = torch.randint(0, 11, (3, 5))
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1) for m in (model, reference)]
    handle = step_in_backward(optimizers[0])
    optimizers[0].load_state_dict(optimizers[0].state_dict())  # new group dicts (as Accelerate's prepare makes)
    schedules = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1 / (s + 1)) for o in optimizers]
    for _ in range(3):
        for m, o, s in zip((model, reference), optimizers, schedules):
            m(x).square().mean().backward()
            o.step()
            s.step()
            o.zero_grad()
        assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters()))
    handle.remove()
    before = [p.clone() for p in model.parameters()]
    model(x).sum().backward()  # no update hooks left: the gradient stays, the weights do not move
    assert all(p.grad is not None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))


def test_bounded_recovery_trains_like_the_kept_one_and_refuses_what_it_cannot_do(tmp_path, tokenizer):
    from headwise.training.memory import is_recomputing

    task, model = lm_case(tmp_path, tokenizer)
    headwise.apply_masks(model, {s.name: [1.0, 0.0, 1.0, 1.0] for s in headwise.find_sites(model)})
    trained = []
    for memory in ("keep", "bounded"):
        student = copy.deepcopy(model)
        headwise.recover(student, tokenizer, task, teacher="off", max_steps=3, batch_size=2, learning_rate=1e-3,
                         max_grad_norm=0.0, progress=False, memory=memory)
        assert not is_recomputing(student) and all(p.grad is None for p in student.parameters())
        trained.append(student.state_dict())
    keep, bounded = trained
    assert any(not torch.equal(keep[k], v) for k, v in model.state_dict().items())  # it trained
    for name in keep:
        torch.testing.assert_close(bounded[name], keep[name], rtol=1e-4, atol=1e-6)
    with pytest.raises(HeadwiseError, match="gradient accumulation"):
        headwise.recover(model, tokenizer, task, teacher="off", max_steps=1, memory="bounded",
                         gradient_accumulation_steps=2, progress=False)
    with pytest.raises(HeadwiseError, match="global gradient norm"):
        headwise.recover(model, tokenizer, task, teacher="off", max_steps=1, memory="bounded", max_grad_norm=1.0,
                         progress=False)
    with pytest.raises(HeadwiseError, match="training memory 'low'"):
        headwise.recover(model, tokenizer, task, teacher="off", max_steps=1, memory="low", progress=False)


def test_auto_training_memory_bounds_it_when_gradients_and_optimizer_state_would_not_fit(monkeypatch):
    from headwise.analysis import activations
    from headwise.training.memory import choose_memory

    model = torch.nn.Linear(100, 100)  # 40,400 bytes trained: 121,200 for gradients and AdamW's two moments
    monkeypatch.setattr(activations, "available_bytes", lambda device: 242_400)
    assert choose_memory("auto", model) == "keep" and choose_memory("bounded", model) == "bounded"
    monkeypatch.setattr(activations, "available_bytes", lambda device: 242_399)
    assert choose_memory("auto", model) == "bounded" and choose_memory("keep", model) == "keep"
    model.requires_grad_(False)
    assert choose_memory("auto", model) == "keep"


def _most_held(run, size: int) -> int:
    """The most CPU allocations of exactly ``size`` bytes alive at once while ``run()`` runs (the profiler's
    allocation and free events, in order)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    held = most = 0
    for _, nbytes in events:
        held += (nbytes == size) - (nbytes == -size)
        most = max(most, held)
    return most


def test_bounded_recovery_of_a_tied_head_holds_one_gradient_of_it(tmp_path, tokenizer, monkeypatch):
    """A causal LM whose token embedding is its output head (1,000 × 32 floats, a size no other tensor has): under
    memory="bounded" the loss adds the head's weight gradient into ``.grad`` and the lookup's rows come sparse
    (``training.memory.bounded``), so at most three such matrices exist at once: AdamW's two moments and one
    gradient. The usual step holds the head's part, the lookup's dense part and their sum beside the moments.
    Both train the same weights."""
    from headwise.tasks import lm

    monkeypatch.setattr(lm, "LOSS_CHUNK_MIN_ROWS", 8)  # logit chunks of 8 × 1,000 floats: not the head's size
    monkeypatch.setattr(lm, "LOSS_CHUNK_BYTES", 8 * 1000 * 4)
    (tmp_path / "text.txt").write_text("\n".join(sentence(i) for i in range(60)) + "\n")
    torch.manual_seed(0)
    config = tf.LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=37, vocab_size=1000, max_position_embeddings=64,
                            tie_word_embeddings=True)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="headwise").eval()
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    headwise.apply_masks(model, {s.name: [1.0, 0.0, 1.0, 1.0] for s in headwise.find_sites(model)})
    task = LanguageModeling(data=str(tmp_path / "text.txt"), max_length=16)
    trained, most = [], {}
    for memory in ("keep", "bounded"):
        student = copy.deepcopy(model)
        most[memory] = _most_held(lambda: headwise.recover(
            student, tokenizer, task, teacher="off", max_steps=2, batch_size=2, learning_rate=1e-3,
            max_grad_norm=0.0, progress=False, memory=memory), 1000 * 32 * 4)
        assert not student.get_input_embeddings().sparse and all(p.grad is None for p in student.parameters())
        trained.append(student.state_dict())
    assert most == {"keep": most["keep"], "bounded": 3} and most["keep"] >= 4, most
    for name, value in trained[0].items():
        torch.testing.assert_close(trained[1][name], value, rtol=1e-4, atol=1e-6)
