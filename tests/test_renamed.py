"""Names renamed by issue 70 ("apply" means applying a method config to a model) still work for one release: each
former name gives one ``FutureWarning`` naming the new one, and the same result as the new name."""

from __future__ import annotations

import warnings

import pytest
import torch

import headwise
from headwise.contract import METHODS, MethodHooks, register, register_method
from headwise.declaration import Declaration
from headwise.runtime import detach_all
from headwise.runtime.ops import attached
from tests.test_method_contract import HeadScaleConfig, _apply_scale
from tests.tiny import tiny_inputs, tiny_model


def _out(model, inputs):
    with torch.no_grad():
        return model(**inputs).last_hidden_state


def _unscale(model):
    detach_all(model, "head_scale", missing_ok=False)


def _present(model):
    return bool(attached(model, "output", "head_scale"))


@pytest.fixture
def registered():
    yield
    METHODS.pop("head_scale", None)


def test_hooks_named_apply_and_remove_bind_as_attach_and_detach_with_a_notice(registered):
    with pytest.warns(FutureWarning, match="'apply' still works") as caught:
        @register(Declaration(name="head_scale", config=HeadScaleConfig))
        class OldHooks(MethodHooks):
            apply = staticmethod(_apply_scale)
            remove = staticmethod(_unscale)
            present = staticmethod(_present)
            example = staticmethod(lambda model: HeadScaleConfig())
    assert any("'remove' still works" in str(w.message) for w in caught)
    method = METHODS["head_scale"]
    assert method.attach is _apply_scale and method.detach is _unscale
    with pytest.warns(FutureWarning, match="Method.apply is now Method.attach"):
        assert method.apply is method.attach

    model, (inputs, real) = tiny_model("bert"), tiny_inputs("bert")
    before = _out(model, inputs)
    headwise.apply(model, HeadScaleConfig(factor=0.5))
    scaled = _out(model, inputs)
    reference = tiny_model("bert")
    _apply_scale(reference, HeadScaleConfig(factor=0.5))
    assert torch.equal(scaled[real], _out(reference, inputs)[real]) and not torch.allclose(scaled[real], before[real])
    headwise.remove(model, "head_scale")
    assert torch.equal(_out(model, inputs)[real], before[real])


def test_register_method_remove_is_detach_with_a_notice(registered):
    with pytest.warns(FutureWarning, match=r"remove=\.\.\.\) is now detach"):
        method = register_method("head_scale", HeadScaleConfig, _apply_scale, remove=_unscale, present=_present,
                                 example=lambda model: HeadScaleConfig())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert method.detach is _unscale and method.reversible


def test_mechanisms_apply_is_use_with_a_notice():
    from headwise import mechanisms

    inputs, real = tiny_inputs("bert")
    new, old = tiny_model("bert"), tiny_model("bert")
    ops = mechanisms.use(new, "linear")
    with pytest.warns(FutureWarning, match="headwise.mechanisms.apply is now use"):
        former = mechanisms.apply(old, "linear")
    assert set(former) == set(ops) and mechanisms.mechanisms_of(old)
    for op_new, op_old in zip(ops.values(), former.values()):
        assert op_old.spec() == op_new.spec()
    assert torch.equal(_out(old, inputs)[real], _out(new, inputs)[real])


def test_plan_apply_is_execute_with_a_notice():
    from test_plan_files import hand_plan, tiny_bert

    from headwise.sites import find_sites

    new, old = tiny_bert(), tiny_bert()
    plan = hand_plan(new)
    plan.execute(new)
    with pytest.warns(FutureWarning, match="Plan.apply is now Plan.execute"):
        plan.apply(old)
    assert [s.num_heads for s in find_sites(old)] == [s.num_heads for s in find_sites(new)] == [3, 4]
    assert all(torch.equal(a, b) for a, b in zip(old.state_dict().values(), new.state_dict().values()))


def test_quantization_method_is_quantizer_with_a_notice_and_saved_records_read_quietly():
    from headwise.contract import config_from_dict, config_to_dict
    from headwise.quantization import QuantizationConfig
    from headwise.quantization.layer import AttentionQuantizer

    new = QuantizationConfig(quantizer="log3", threshold=0.01)
    with pytest.warns(FutureWarning, match=r"QuantizationConfig\(method=\.\.\.\) is now quantizer="):
        old = QuantizationConfig(method="log3", threshold=0.01)
    assert old == new and old.quantizer == "linear_slog_clamped_midval" and old.bits == 3
    with pytest.warns(FutureWarning, match="QuantizationConfig.method is now QuantizationConfig.quantizer"):
        assert old.method == new.quantizer
    record = config_to_dict(new)
    assert record["config"]["quantizer"] == "linear_slog_clamped_midval" and "method" not in record["config"]
    saved = {**record, "config": {("method" if k == "quantizer" else k): v for k, v in record["config"].items()}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a record written before the rename reads without a notice
        assert config_from_dict(saved) == new
        spec = {("method" if k == "quantizer" else k): v for k, v in new.to_dict().items()}
        assert AttentionQuantizer(**spec).config == new


def test_quantize_attention_method_keyword_gives_the_same_ops():
    model_new, model_old = tiny_model("bert"), tiny_model("bert")
    inputs, real = tiny_inputs("bert")
    headwise.quantize_attention(model_new, quantizer="lin", bits=4)
    with pytest.warns(FutureWarning, match="quantizer="):
        headwise.quantize_attention(model_old, method="lin", bits=4)
    assert torch.equal(_out(model_old, inputs)[real], _out(model_new, inputs)[real])


def test_dynamic_swap_method_is_rule_and_pruning_curve_method_is_strategy_with_a_notice():
    from headwise.mixing.dynamic import DynamicSwapConfig
    from headwise.pruning.schedule import PruningCurve

    with pytest.warns(FutureWarning, match=r"DynamicSwapConfig\(method=\.\.\.\) is now rule="):
        old = DynamicSwapConfig(method="soft", max_switches=2)
    assert old == DynamicSwapConfig(rule="soft", max_switches=2)
    with pytest.warns(FutureWarning, match="DynamicSwapConfig.method is now DynamicSwapConfig.rule"):
        assert old.method == "soft"
    with pytest.raises(headwise.HeadwiseError, match="unknown dynamic swap rule 'best'"):
        DynamicSwapConfig(rule="best")
    with pytest.warns(FutureWarning, match="PruningCurve.method is now PruningCurve.strategy"):
        assert PruningCurve(strategy="one-shot importance").method == "one-shot importance"


# ---- training in one package (issue 70): the former paths forward to headwise.training -------------------------

@pytest.mark.parametrize("old, name, new", [
    ("headwise.trainer", "HeadwiseTrainer", "headwise.training.trainer"),
    ("headwise.trainer", "is_head_parameter", "headwise.training.trainer"),
    ("headwise.tasks.recipes", "l0_prune", "headwise.training.recipes"),
    ("headwise.tasks.recipes", "importance_prune", "headwise.training.recipes"),
    ("headwise.tasks.recovery", "switched_off", "headwise.training.recovery"),
    ("headwise.tasks.recovery", "MODES", "headwise.training.recovery"),
    ("headwise.tasks", "recover", "headwise.training"),
    ("headwise.tasks", "DistillationObjective", "headwise.training"),
    ("headwise.tasks", "CachedTeacher", "headwise.training"),
])
def test_former_training_paths_give_the_same_object_with_a_notice(old, name, new):
    import importlib

    former, now = importlib.import_module(old), importlib.import_module(new)
    with pytest.warns(FutureWarning, match=f"{old}.{name} is now {new}.{name}"):
        assert getattr(former, name) is getattr(now, name)
    with pytest.raises(AttributeError):
        getattr(former, "no_such_name")


def test_task_finetune_and_train_objective_are_training_functions_with_a_notice(tmp_path):
    from headwise.tasks import TaskObjective, train_tokenizer
    from headwise.training import finetune
    from tests.test_recovery import sentence, stsb_case

    tokenizer = train_tokenizer([sentence(i) for i in range(200)], vocab_size=80, min_frequency=1)
    task, model = stsb_case(tmp_path, tokenizer)
    twin, other, fresh = (stsb_case(tmp_path, tokenizer)[1] for _ in range(3))
    options = {"max_steps": 2, "batch_size": 4, "learning_rate": 1e-2, "progress": False}
    finetune(model, tokenizer, task, **options)
    with pytest.warns(FutureWarning, match="Task.finetune is now headwise.training.finetune"):
        task.finetune(twin, tokenizer, **options)
    with pytest.warns(FutureWarning, match="Task.train_objective is now headwise.training.train_objective"):
        task.train_objective(TaskObjective(task, other), tokenizer, **options)
    trained, start = model.state_dict(), fresh.state_dict()
    for former in (twin, other):
        assert all(torch.equal(trained[name], value) for name, value in former.state_dict().items())
    assert any(not torch.equal(trained[name], start[name]) for name in trained)  # the two steps trained it
