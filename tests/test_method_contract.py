"""One contract over every registered method (``headwise.contract.METHODS``), in the spirit of peft's common tester:
config round-trip, apply (identity where the method says so; a refusal leaves the model untouched), remove restores
bit-exactly (or raises for weight edits), removing what is absent raises, save/reload equal in a fresh process, and
the ``meta`` device. A toy method (a per-head scale) registered in this file gets all of it, and a CLI verb, from
one ``register_method`` call."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from tiny import tiny_inputs, tiny_model

import headwise
from headwise import HeadwiseError
from headwise.cli import main
from headwise.contract import (METHODS, MethodConfig, Selection, config_fields, config_from_dict, config_to_dict,
                               load_methods, method_of, register_method, with_keywords)
from headwise.runtime import HeadOp, attach, detach_all, enable
from headwise.runtime.ops import attached
from headwise.sites import find_sites

load_methods()  # the registry is full at collection, whichever test modules were collected before this one

FAMILIES = ["bert", "gpt2", "llama"]


def _out(model, inputs):
    with torch.no_grad():
        return model(**inputs).last_hidden_state


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same_state(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def check_contract(name: str, family: str, tmp: Path | None = None) -> bool:
    """Run the contract for one method on one tiny family; returns whether the method applied (False: refused)."""
    method = METHODS[name]
    model = tiny_model(family)
    inputs, real = tiny_inputs(family)
    try:
        config = method.example(model)
    except HeadwiseError:  # the method cannot serve this family at all (e.g. a KV policy on an encoder)
        return False

    # config round-trip through JSON
    record = json.loads(json.dumps(config_to_dict(config)))
    assert record["method"] == name and record["version"] == method.version
    assert config_to_dict(config_from_dict(record)) == record
    assert method_of(config) is method

    # removing what is absent raises (missing_ok: quiet); weight edits always refuse removal
    with pytest.raises(HeadwiseError):
        headwise.remove(model, name)
    if method.reversible:
        headwise.remove(model, name, missing_ok=True)

    before, state, meta = _out(model, inputs), _state(model), copy.deepcopy(model.config.to_dict())
    try:
        headwise.apply(model, config)
    except HeadwiseError:  # refused for this family: nothing may have changed
        assert _same_state(state, _state(model)) and model.config.to_dict() == meta
        assert torch.equal(_out(model, inputs)[real], before[real])
        return False
    edited = _out(model, inputs)
    if method.identity:
        assert torch.allclose(edited[real], before[real], atol=1e-5), f"{name} example should change nothing"

    if tmp is not None:  # save now; reloaded in a fresh process by the caller
        headwise.save_pretrained(model, tmp / f"{name}-{family}")
        torch.save({"inputs": inputs, "out": edited}, tmp / f"{name}-{family}.pt")

    if method.reversible:
        headwise.remove(model, name)
        assert torch.equal(_out(model, inputs)[real], before[real])
        assert _same_state(state, _state(model))
        assert all(getattr(s.module, "headwise", None) is None for s in find_sites(model))
        with pytest.raises(HeadwiseError):
            headwise.remove(model, name)
    else:
        with pytest.raises(HeadwiseError, match="cannot be removed"):
            headwise.remove(model, name)
    return True


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_registered_method_keeps_the_contract(name):
    applied = [family for family in FAMILIES if check_contract(name, family)]
    assert applied, f"{name} applies to none of {FAMILIES}"


def test_every_method_reloads_in_a_fresh_process(tmp_path):
    """Every method's example on every family it serves, saved, then reloaded in one fresh process."""
    saved = [f"{name}-{family}" for name in sorted(METHODS) for family in FAMILIES
             if check_contract(name, family, tmp_path)]
    script = (
        "import sys, torch, headwise\n"
        "for folder in sys.argv[1:]:\n"
        "    model = headwise.from_pretrained(folder)\n"
        "    with torch.no_grad():\n"
        "        out = model(**torch.load(folder + '.pt')['inputs']).last_hidden_state\n"
        "    torch.save(out, folder + '.reloaded.pt')\n")
    subprocess.run([sys.executable, "-c", script, *saved], check=True, cwd=tmp_path)
    assert {s.split("-")[0] for s in saved} == set(METHODS)
    for folder in saved:
        _, real = tiny_inputs(folder.split("-")[1])
        before = torch.load(tmp_path / f"{folder}.pt")["out"]
        after = torch.load(tmp_path / f"{folder}.reloaded.pt")
        assert torch.allclose(after[real], before[real], atol=1e-6), f"{folder} differs after reload"


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_applies_on_meta_or_refuses_in_one_line(name):
    """On the ``meta`` device (a big model's shapes without its weights) a method that attaches ops or reshapes
    applies without materialising anything; one that fits weights refuses with a HeadwiseError."""
    with torch.device("meta"):
        model = tiny_model("llama")
    method = METHODS[name]
    config = method.example(model)
    if not method.meta:
        with pytest.raises(HeadwiseError, match="meta device"):
            headwise.apply(model, config)
        return
    headwise.apply(model, config)
    assert all(t.is_meta for t in model.state_dict().values())
    if name in ("gates", "masks", "l0", "mixing", "quantization", "kv_policy"):  # ops whose forward is shape-only
        out = model(input_ids=torch.zeros(2, 5, dtype=torch.long, device="meta")).last_hidden_state
        assert out.is_meta and out.shape == (2, 5, model.config.hidden_size)


def test_config_and_keyword_conflicts_raise():
    from headwise.collaborative import CollaborativeConfig
    from headwise.conversion import GQAConfig, LatentConfig
    from headwise.quantization import SweepConfig, sweep

    model = tiny_model("llama")
    with pytest.raises(HeadwiseError, match="kv_heads=1 conflicts"):
        headwise.convert_gqa(model, kv_heads=1, config=GQAConfig(kv_heads=2, init="mean"))
    with pytest.raises(HeadwiseError, match="kv_budget=0.25 conflicts"):
        headwise.convert_latent(model, kv_budget=0.25, config=LatentConfig(kv_budget=0.5, init="svd"))
    with pytest.raises(HeadwiseError, match="bits=2 conflicts"):
        headwise.quantize_attention(model, headwise.QuantizationConfig(bits=3), bits=2)
    with pytest.raises(HeadwiseError, match="dk=8 conflicts"):
        headwise.compress(tiny_model("bert"), dk=8, config=CollaborativeConfig(dk=16))
    with pytest.raises(HeadwiseError, match=r"kinds=\['enc-self'\] conflicts with the Selection"):
        headwise.L0Config(kinds=["enc-self"], selection=Selection(kinds=["dec-self"]))
    with pytest.raises(HeadwiseError, match="batch_size=8 conflicts with the AnalysisConfig"):
        headwise.analyze(model, None, ["a text"], headwise.AnalysisConfig(batch_size=4), batch_size=8)
    with pytest.raises(HeadwiseError, match="tolerance=0.02 conflicts with the SweepConfig"):
        sweep(model, SweepConfig(tolerance=0.05), metric=lambda m: 1.0, tolerance=0.02)
    # agreeing values are fine, and the keyword-only form still works
    headwise.quantize_attention(model, headwise.QuantizationConfig(quantizer="log3"),
                                quantizer="linear_slog_clamped_midval")
    assert headwise.L0Config(kinds=["dec-self"]).selection.kinds == ("dec-self",)
    assert headwise.L0Config(kinds=["dec-self"], selection=Selection(kinds=["dec-self"])).kinds == ("dec-self",)


def test_with_keywords_builds_fills_or_refuses():
    from headwise.quantization import SweepConfig

    assert with_keywords(Selection, None, kinds=["enc-self"], layers=None) == Selection(kinds=("enc-self",))
    given = Selection(layers=[1])
    assert with_keywords(Selection, given) is given
    assert with_keywords(Selection, given, kinds=["enc-self"], layers=[1]) == Selection(["enc-self"], [1])  # fills
    assert with_keywords(SweepConfig, SweepConfig(tolerance=0.05), tolerance=0.05).tolerance == 0.05
    with pytest.raises(HeadwiseError, match="^give dk= or a CollaborativeConfig$"):
        with_keywords(headwise.CollaborativeConfig, None, dk=None)
    with pytest.raises(HeadwiseError, match=r"^layers=\[2\] conflicts with the Selection \(layers=\(1,\)\); give one"):
        with_keywords(Selection, given, layers=[2])


@pytest.mark.parametrize("record,kept", [
    ({"method": "l0", "version": 1, "config": {"lam": 0.5, "target_heads": 36, "init": 3.0}}, {"init": 3.0}),
    ({"method": "mixing", "version": 1, "config": {"gamma": 1.0, "form": "seed", "kinds": ["enc-self"]}},
     {"kinds": ("enc-self",)}),
])
def test_an_older_record_with_training_settings_loads_with_a_notice(record, kept, capsys):
    config = config_from_dict(record)
    assert all(getattr(config, k) == v for k, v in kept.items())
    notice = capsys.readouterr().err.strip().splitlines()
    assert len(notice) == 1 and "training settings" in notice[0] and "Training now" in notice[0]


def test_configs_hold_only_what_is_attached_and_every_field_has_help():
    for method in METHODS.values():
        for f, _ in config_fields(method.config):
            assert f.name == "selection" or f.metadata.get("help"), f"{method.config.__name__}.{f.name} has no help"
    for name in ("lam", "reduction", "target_heads", "lambda_lr", "target_warmup"):
        assert name not in {f.name for f, _ in config_fields(headwise.L0Config)}
    for name in ("gamma", "ratios", "start", "radius", "direction", "form"):
        assert name not in {f.name for f, _ in config_fields(headwise.MixingConfig)}


def test_every_remove_verb_raises_on_nothing_attached():
    model = tiny_model("bert")
    for remove in (headwise.remove_gates, headwise.remove_masks, headwise.remove_l0_gates, headwise.remove_mixers,
                   headwise.remove_quantization, headwise.restore_attention, headwise.remove_kv_policy):
        with pytest.raises(HeadwiseError):
            remove(model)
    headwise.remove_gates(model, missing_ok=True)


def test_a_selection_limits_the_sites_and_bad_selections_raise():
    model = tiny_model("llama")
    ops = headwise.apply(model, headwise.pruning.GateConfig(selection=Selection(layers=[1])))
    assert [s.name for s in find_sites(model) if s.path in ops] == ["dec-self.1"]
    with pytest.raises(HeadwiseError, match="no attention site serves layer 5"):
        headwise.apply(model, headwise.MixingConfig(selection=Selection(layers=[5])))
    with pytest.raises(HeadwiseError, match="takes no selection"):
        headwise.conversion.GQAConfig(kv_heads=1, selection=Selection(layers=[0]))
    with pytest.raises(HeadwiseError, match="must be ints"):
        Selection(layers=["0"])


# ---- a toy method: one package-sized block and one register_method call -------------------------------------
class HeadScale(HeadOp):
    """``out[:, :, h] *= factor`` for every head (a fixed, saved op)."""

    op_type = "test_head_scale"

    def __init__(self, num_heads: int, factor: float) -> None:
        super().__init__()
        self.num_heads, self.factor = num_heads, factor

    def spec(self) -> dict:
        return {"num_heads": self.num_heads, "factor": self.factor}

    def forward(self, out: torch.Tensor) -> torch.Tensor:
        return out * self.factor


@dataclass
class HeadScaleConfig(MethodConfig):
    """Scale every head's output by ``factor``."""

    factor: float = 1.0

    def __post_init__(self) -> None:
        if not self.factor > 0:
            raise HeadwiseError(f"factor must be > 0, got {self.factor}")


def _apply_scale(model, config):
    ops = {s.path: attach(s, "output", "head_scale", HeadScale(s.num_heads, config.factor)) for s in config.sites(model)}
    enable(model)
    return ops


@pytest.fixture
def toy_method():
    register_method("head_scale", HeadScaleConfig, _apply_scale,
                    detach=lambda model: detach_all(model, "head_scale", missing_ok=False),
                    present=lambda model: bool(attached(model, "output", "head_scale")),
                    example=lambda model: HeadScaleConfig(), identity=True)
    yield METHODS["head_scale"]
    del METHODS["head_scale"]


def test_a_toy_method_gets_apply_remove_reload_the_contract_and_a_cli_verb(toy_method, tmp_path):
    for family in FAMILIES:
        assert check_contract("head_scale", family)
    model = tiny_model("bert")
    inputs, real = tiny_inputs("bert")
    before = _out(model, inputs)
    headwise.apply(model, HeadScaleConfig(factor=0.5, selection=Selection(names=["enc-self.1"])))
    headwise.save_pretrained(model, tmp_path / "scaled")
    again = headwise.from_pretrained(tmp_path / "scaled")
    assert torch.equal(_out(again, inputs)[real], _out(model, inputs)[real])
    assert not torch.allclose(_out(model, inputs)[real], before[real])

    saved = tiny_model("bert")
    saved.save_pretrained(tmp_path / "base")
    assert main(["edit", "head_scale", "--model", str(tmp_path / "base"), "--factor", "0.5", "--names",
                 "enc-self.1", "--out", str(tmp_path / "cli")]) == 0
    record = json.loads((tmp_path / "cli" / "edit.json").read_text())
    assert record["config"]["factor"] == 0.5 and record["config"]["selection"]["names"] == ["enc-self.1"]
    from_cli = headwise.from_pretrained(tmp_path / "cli" / "model")
    assert torch.equal(_out(from_cli, inputs)[real], _out(model, inputs)[real])
    assert main(["edit", "head_scale", "--model", str(tmp_path / "base"), "--factor", "-1",
                 "--out", str(tmp_path / "bad")]) == 2
    assert not (tmp_path / "bad").exists()


def test_registering_a_name_or_config_twice_raises(toy_method):
    with pytest.raises(HeadwiseError, match="clashes"):
        register_method("head_scale_2", HeadScaleConfig, _apply_scale, example=lambda m: HeadScaleConfig())
    with pytest.raises(HeadwiseError, match="clashes"):
        register_method("head_scale", headwise.MixingConfig, _apply_scale, example=lambda m: HeadScaleConfig())


def test_every_method_saved_folder_loads_right_in_plain_transformers_or_refuses_naming_headwise(tmp_path):
    """Plain ``AutoModel.from_pretrained`` on every method's saved folder gives the edited model's outputs, or
    refuses a sealed folder, naming its custom code (``load_with_headwise.py``, which names headwise); with
    ``trust_remote_code=True`` that code loads it through headwise, with the edited model's outputs. It never loads
    something else silently."""
    import transformers

    saved = [f"{name}-{family}" for name in sorted(METHODS) for family in FAMILIES
             if check_contract(name, family, tmp_path)]
    refused = []
    for folder in saved:
        stored = torch.load(tmp_path / f"{folder}.pt")
        _, real = tiny_inputs(folder.split("-")[1])
        try:
            plain = transformers.AutoModel.from_pretrained(tmp_path / folder, trust_remote_code=False).eval()
        except ValueError as err:  # a sealed folder: its custom code is named, and that code names headwise
            assert f"{tmp_path / folder} contains custom code" in str(err), f"{folder}: {err}"
            assert "headwise.from_pretrained(folder)" in (tmp_path / folder / "load_with_headwise.py").read_text()
            refused.append(folder)
            plain = transformers.AutoModel.from_pretrained(tmp_path / folder, trust_remote_code=True).eval()
        with torch.no_grad():
            out = plain(**stored["inputs"]).last_hidden_state
        assert torch.allclose(out[real], stored["out"][real], atol=1e-5), f"{folder} loads silently different"
    assert refused and len(refused) < len(saved)  # both kinds occur: sealed edits and plain-expressible ones


def test_a_renamed_method_still_reads_its_old_name():
    old = {"method": "mechanism", "version": 1, "config": {"mechanism": "local", "args": {"window": 2}}}
    config = config_from_dict(old)
    assert type(config).__name__ == "ReplaceConfig" and method_of("mechanism").name == "replace"
    assert config_to_dict(config)["method"] == "replace"
    with pytest.raises(HeadwiseError, match="taken by the registered method 'replace'"):
        register_method("other", _Other, lambda model, c: None, example=lambda model: _Other(), aliases=("mechanism",))


@dataclass
class _Other(MethodConfig):
    """A config whose registration is refused (an alias already taken)."""


def test_verbs_take_a_selection_and_their_former_keywords_warn_then_convert():
    model = tiny_model("bert")
    first, second = (s.name for s in find_sites(model))
    assert list(headwise.add_gates(model, selection=Selection(layers=[1]))) == [find_sites(model)[1].path]
    for verb, call, undo in [
        ("add_gates", lambda **kw: headwise.add_gates(model, **kw), headwise.remove_gates),
        ("replace_attention", lambda **kw: headwise.replace_attention(model, "linear", **kw), headwise.restore_attention),
        ("quantize_attention", lambda **kw: headwise.quantize_attention(model, **kw), headwise.remove_quantization),
    ]:
        with pytest.warns(FutureWarning, match=rf"^{verb}\(sites=\) is deprecated; pass selection=Selection"):
            assert len(call(sites=[first])) == 1
        undo(model)
        with pytest.warns(FutureWarning), pytest.raises(HeadwiseError, match="conflicts with the Selection"):
            call(sites=[first], selection=Selection(names=[second]))
        with pytest.warns(FutureWarning):  # agreeing: one selection
            assert len(call(sites=[first], selection=Selection(names=[first]))) == 1
        undo(model)
    with pytest.warns(FutureWarning, match=r"add_gates\(kinds=, layers=\)"):
        assert len(headwise.add_gates(model, kinds=["enc-self"], layers=[0])) == 1
    with pytest.warns(FutureWarning, match=r"replace_attention\(kinds=\)"):
        assert len(headwise.replace_attention(model, "linear", kinds=["enc-self"])) == 2
    with pytest.warns(FutureWarning, match=r"restore_attention\(sites=\)"):
        headwise.restore_attention(model, [first])
    headwise.restore_attention(model, selection=Selection(names=[second]))
    with pytest.raises(HeadwiseError, match="conflicts with the QuantizationConfig"), pytest.warns(FutureWarning):
        headwise.quantize_attention(model, headwise.QuantizationConfig(selection=Selection(names=[second])),
                                    sites=[first])


# ---- declarations and hooks ---------------------------------------------------------------------------------------
def test_every_declared_method_is_registered_with_its_declaration_and_no_other():
    from headwise.contract import METHOD_PACKAGES, declarations

    declared = declarations()
    assert set(declared) == set(METHODS)  # every package of the list declares a method (no count: adding.md)
    assert {".".join(d.config.__module__.split(".")[:2]) for d in declared.values()} == set(METHOD_PACKAGES)
    for name, method in METHODS.items():
        assert method.declaration is declared[name] and method.config is declared[name].config
        assert method.summary and method.summary == declared[name].summary


def test_a_method_is_built_by_keywords_only():
    from headwise.contract import Method

    method = METHODS["gates"]
    with pytest.raises(TypeError):
        Method(method.declaration, method.hooks)  # noqa: the positional form is gone
    assert Method(declaration=method.declaration, hooks=method.hooks).name == "gates"


@dataclass
class _Hookless(MethodConfig):
    """A config whose method lacks hooks."""


@pytest.mark.parametrize("planned, hooks, missing", [
    (None, {"attach": lambda self, model, c: None}, "example (every method)"),
    (None, {"attach": lambda self, model, c: None, "example": lambda self, model: _Hookless(),
            "detach": lambda self, model: None}, "present (a reversible method gives detach and present)"),
    ("alone", {"attach": lambda self, model, c: None, "example": lambda self, model: _Hookless()},
     "levels (a planned method); describe (a planned method)"),
    ("heads", {"attach": lambda self, model, c: None, "example": lambda self, model: _Hookless(),
               "levels": lambda self, model, context: None, "describe": lambda self, c: ""},
     "rank (a planned method of role 'heads')"),
    (None, {"attach": lambda self, model, c: None, "example": lambda self, model: _Hookless(),
            "legacy_kind": "old_kind"}, "replay (legacy_kind names journal records"),
])
def test_a_declaration_that_misses_a_required_hook_is_refused_naming_it(planned, hooks, missing):
    from headwise.contract import MethodHooks, register
    from headwise.declaration import Declaration, Planned

    plan = None if planned is None else Planned(order=99, role=planned,
                                                rankings=("gradient",) if planned == "heads" else ())
    declaration = Declaration(name="hookless", config=_Hookless, planned=plan)
    with pytest.raises(HeadwiseError, match="method 'hookless' misses hooks: " + re.escape(missing)):
        register(declaration)(type("Hooks", (MethodHooks,), hooks))
    assert "hookless" not in METHODS


def test_a_declaration_refuses_bad_names_examples_and_configs():
    from headwise.declaration import Declaration

    with pytest.raises(HeadwiseError, match="lower-case letters"):
        Declaration(name="Bad-Name", config=_Hookless)
    with pytest.raises(HeadwiseError, match="an example is a `headwise edit toy ...` line"):
        Declaration(name="toy", config=_Hookless, examples=("headwise prune --keep 3",))
    with pytest.raises(HeadwiseError, match="must be a dataclass"):
        Declaration(name="toy", config=dict)
    assert Declaration(name="toy", config=_Hookless).summary == "A config whose method lacks hooks."


def test_a_former_name_typed_by_a_user_warns_once_and_a_saved_record_resolves_quietly(recwarn):
    from headwise.contract import method_named

    with pytest.warns(FutureWarning, match="method 'mechanism' is now 'replace'"):
        assert method_named("mechanism").name == "replace"
    assert method_of("mechanism").name == "replace" and not [w for w in recwarn if w.category is FutureWarning]
    with pytest.raises(HeadwiseError, match="no method 'kv_heads'"):  # plan format 1's names: only where plans name
        method_named("kv_heads")
