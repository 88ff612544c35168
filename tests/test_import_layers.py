"""Layers import downward only: every ``import`` of every module (top-level and lazy ones inside functions, and the
names a lazy package lists under ``if TYPE_CHECKING:``, read with ``ast``) goes to a lower layer, or stays inside
its own package. Method packages may use each other only through the allow-list below, each entry with its
reason. The methods layer is ``headwise.contract.METHOD_PACKAGES`` (read from the checked tree's source, so a new
method package joins it by that one line) and analysis. See docs/design.md for the picture."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


def method_packages(src: Path = SRC) -> tuple[str, ...]:
    """``METHOD_PACKAGES`` as the tree at ``src`` writes it in ``headwise/contract.py`` (read, not imported)."""
    tree = ast.parse((src / "headwise" / "contract.py").read_text(encoding="utf-8"))
    value = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "METHOD_PACKAGES" for t in node.targets))
    return tuple(ast.literal_eval(value))


def layers(src: Path = SRC) -> list[tuple[str, tuple[str, ...]]]:
    """The layers, lowest first. A module belongs to the longest prefix that names it; "headwise" alone is the
    package __init__."""
    return [
        ("core", ("headwise.errors", "headwise.keywords", "headwise.version", "headwise.compat", "headwise.batching",
                  "headwise.allocator", "headwise.io.files", "headwise.io.manifest", "headwise.io.spill",
                  "headwise.progress", "headwise.lazy", "headwise.flags", "headwise.declaration", "headwise.sweep")),
        ("sites", ("headwise.sites",)),
        ("runtime", ("headwise.runtime",)),
        # one-call save/reload and model loading rebuild the runtime's ops on a fresh model
        ("persistence", ("headwise.io", "headwise.models", "headwise.contract")),
        # per-head statistics and importance (no method of its own; pruning and mixing use it), and every method
        ("methods", ("headwise.analysis", *method_packages(src))),
        ("tasks", ("headwise.tasks",)),
        # the Trainer with head penalties and a task's training through it, recovery, recipes, KV gates, translation
        ("training", ("headwise.training", "headwise.trainer")),
        ("planning", ("headwise.planning",)),
        ("workflows", ("headwise.workflows",)),  # a verb's whole run as a library function (tasks, plans, recovery)
        ("report", ("headwise.report",)),
        # edited folders in other clients: transformers' Auto classes (trust_remote_code), lm-eval's model type, vLLM
        ("clients", ("headwise.clients",)),
        ("cli", ("headwise.cli",)),
        ("public", ("headwise",)),
    ]


LAYERS = layers()
RANK = {name: rank for rank, (name, _) in enumerate(LAYERS)}

# (importing package, imported package): why one method may use another.
METHOD_ALLOWED: dict[tuple[str, str], str] = {
    ("headwise.pruning", "headwise.analysis"): "importance pruning ranks heads by analysis.gradient_importance",
    ("headwise.mixing", "headwise.analysis"): "dynamic MHR swaps pick heads by an analysed head metric",
}


# (importing, imported) packages of the persistence layer that work together, each with its reason.
PERSISTENCE_ALLOWED: dict[tuple[str, str], str] = {
    ("headwise.models", "headwise.io"): "load_model reloads headwise checkpoints with io.from_pretrained",
    ("headwise.io", "headwise.contract"): "from_pretrained replays the journal through the method registry",
}


# (importing, imported) packages: former module paths and names (issue 70) that forward to where the code is now,
# for one release; each read warns (errors.moved, errors.renamed). Removed with them.
FORMER_PATHS: dict[tuple[str, str], str] = {
    ("headwise.tasks", "headwise.training"): "tasks.recipes, tasks.recovery, tasks.recover / DistillationObjective / "
                                             "CachedTeacher, Task.finetune / train_objective: now in training",
    ("headwise.trainer", "headwise.training"): "headwise.trainer is now headwise.training.trainer",
}


def layer_of(module: str, table: list[tuple[str, tuple[str, ...]]] | None = None) -> tuple[str, str]:
    """(layer, package) of a dotted module name in the layers ``table`` (default: this tree's); the package is
    ``headwise.<first part>``."""
    best = None
    for name, prefixes in table or LAYERS:
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[1])):
                best = (name, prefix)
    if best is None:
        raise AssertionError(f"{module} is in no layer: add its package to LAYERS in {Path(__file__).name}")
    parts = module.split(".")
    return best[0], ".".join(parts[:2]) if len(parts) > 1 else "headwise"


def modules(src: Path = SRC) -> dict[str, Path]:
    out = {}
    for path in sorted((src / "headwise").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(module: str, path: Path, known: dict[str, Path] | None = None) -> list[tuple[str, int]]:
    """Absolute names of every headwise module ``module`` imports, with line numbers (``from x import y`` counts
    ``x.y`` when ``y`` is a module of ``known``, default this tree's, else ``x``)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    known = modules() if known is None else known
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.append((sub if sub in known else target, node.lineno))
    return sorted({(name, line) for name, line in out if name == "headwise" or name.startswith("headwise.")})


def violations(src: Path = SRC) -> list[str]:
    """Every import of the tree at ``src`` that breaks the layers, one line each."""
    table, known, bad = layers(src), modules(src), []
    rank = {name: i for i, (name, _) in enumerate(table)}
    for module, path in known.items():
        layer, package = layer_of(module, table)
        for target, line in imports(module, path, known):
            t_layer, t_package = layer_of(target, table)
            where = f"{path.relative_to(src)}:{line}: {module} ({layer}) imports {target} ({t_layer})"
            if t_package == package or rank[t_layer] < rank[layer] or (package, t_package) in FORMER_PATHS:
                continue
            if layer == t_layer == "methods":
                if (package, t_package) not in METHOD_ALLOWED:
                    bad.append(f"{where}: one method uses another; move the shared part down, or add an allowed "
                               "pair with its reason")
            elif layer == t_layer == "core" or (package, t_package) in PERSISTENCE_ALLOWED:
                continue  # the core is one package spread over top-level modules
            else:
                bad.append(f"{where}: an upward import")
    return bad


def test_every_module_is_in_a_layer():
    for module in modules():
        layer_of(module)


def test_imports_go_downward_only():
    assert violations() == []


@pytest.mark.parametrize("source, wrong", [
    ("from ..training import finetune_stsb\n", "headwise.training"),
    ("def f():\n    from ..cli import main\n", "headwise.cli"),
    ("import headwise.report\n", "headwise.report"),
])
def test_an_upward_import_is_caught(tmp_path, monkeypatch, source, wrong):
    fake = tmp_path / "recipes.py"
    fake.write_text(source)
    found = imports("headwise.pruning.recipes", fake)
    assert [name for name, _ in found] == [wrong]
    layer, _ = layer_of("headwise.pruning.recipes")
    assert RANK[layer_of(wrong)[0]] > RANK[layer]


def test_methods_may_not_use_each_other_unlisted():
    assert ("headwise.quantization", "headwise.analysis") not in METHOD_ALLOWED
    assert layer_of("headwise.quantization.sweep") == ("methods", "headwise.quantization")
    assert layer_of("headwise.io.files")[0] == "core" and layer_of("headwise.io.checkpoint")[0] == "persistence"


def package_imports() -> dict[str, set[str]]:
    """``{package: the other headwise packages its modules import}`` (top-level and lazy imports alike)."""
    out: dict[str, set[str]] = {}
    for module, path in modules().items():
        package = layer_of(module)[1]
        out.setdefault(package, set()).update(layer_of(t)[1] for t, _ in imports(module, path)
                                              if (package, layer_of(t)[1]) not in FORMER_PATHS)
        out[package].discard(package)
    return out


def test_no_two_packages_import_each_other():
    used = package_imports()
    both = sorted((a, b) for a in used for b in used[a] if a < b and a in used.get(b, ()))
    assert both == [], "packages importing each other (move the shared part down): " + str(both)


def test_training_is_one_package_above_the_tasks():
    """The Trainer, a task's training, recovery and the recipes sit in one package above the tasks; the tasks and
    the methods import none of it (a ranking that trains gets ``finetune`` from the planner): no cycle."""
    assert RANK["tasks"] < RANK["training"] < RANK["planning"]
    for module in ("trainer", "memory", "backward_step", "finetune", "recovery", "recipes", "stsb"):
        assert layer_of(f"headwise.training.{module}") == ("training", "headwise.training")
    used = package_imports()
    assert not any("headwise.training" in used[p] for p in ("headwise.tasks", "headwise.pruning", "headwise.runtime"))


def test_former_paths_only_forward():
    """A module that imports across FORMER_PATHS holds no code of its own beyond the forwarding (Task's two former
    methods aside): the former modules are a docstring, imports and ``__getattr__``."""
    for name in ("headwise.tasks.recipes", "headwise.tasks.recovery", "headwise.trainer"):
        tree = ast.parse(modules()[name].read_text(encoding="utf-8"))
        kinds = {type(node).__name__ for node in tree.body}
        assert kinds <= {"Expr", "ImportFrom", "FunctionDef"}, name
        assert [n.name for n in tree.body if isinstance(n, ast.FunctionDef)] == ["__getattr__"], name
