"""No method is named in the command line, the planner or the reports outside the code that fronts its own package:
what a method is (its name, page, examples, former names, planner levels, ranking, costs) is read from its
declaration and its hooks, never from a list kept elsewhere.

What counts as naming a method, read from the source of every module of ``headwise.cli``, ``headwise.planning``
and ``headwise.report`` (``tokenize`` and ``ast``, so comments and prose inside longer strings do not count):

- a string literal that is exactly a registered method's name or former name (``"gqa"``, ``"mechanism"``);
- the name of a registered method's config class, as a name or as a word in a string (``GQAConfig``,
  ``"GQAConfig.init"``);
- an import from a method package (``contract.METHOD_PACKAGES``), at the top or inside a function.

Allowed: a module that is the front end of one method package (a verb of that package's methods, or its report
page: ``FRONT_ENDS``, each with why) may name that package's methods, and only those. Every other module, the
generic code that reads declarations (``cli.edit``, ``cli.plan``, ``cli.apply``, ``cli.options``, ``cli/__init__``,
all of ``planning``, ``report.plan``, ...), may name none.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from headwise.contract import METHOD_PACKAGES, declarations

SRC = Path(__file__).resolve().parents[1] / "src"
CHECKED = ("headwise.cli", "headwise.planning", "headwise.report")

# module -> (the method package it fronts, why)
FRONT_ENDS: dict[str, tuple[str, str]] = {
    "headwise.cli.prune": ("headwise.pruning", "headwise prune: L0, importance or mask pruning"),
    "headwise.cli.quantize": ("headwise.quantization", "headwise quantize: the SPIQA sweep"),
    "headwise.cli.compress": ("headwise.collaborative", "headwise compress: collaborative heads"),
    "headwise.cli.mix": ("headwise.mixing", "headwise mix: swaps and mixers"),
    "headwise.cli.replace": ("headwise.mechanisms", "headwise replace: an efficient mechanism at the sites"),
    "headwise.cli.mechanisms": ("headwise.mechanisms", "headwise mechanisms list"),
    "headwise.cli.kv_policy": ("headwise.kvcache", "headwise kv-policy: the KV-policy experiment"),
    "headwise.cli.convert": ("headwise.conversion", "headwise convert gqa|latent"),
    "headwise.cli.eval": ("headwise.kvcache", "eval lm measures through the KV policy a model carries (a full "
                                              "forward would ignore it)"),
    "headwise.report.compression": ("headwise.collaborative", "the compress report's page"),
}


def module_of(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def method_packages_of() -> tuple[dict[str, str], dict[str, str]]:
    """``({method name or former name: its package}, {config class name: its package})``."""
    names, configs = {}, {}
    for d in declarations().values():
        package = ".".join(d.config.__module__.split(".")[:2])
        names |= dict.fromkeys((d.name, *d.aliases), package)
        configs[d.config.__name__] = package
    return names, configs


def named(module: str, source: str, package: bool = False) -> list[tuple[int, str, str]]:
    """``(line, what, package)`` for every place ``source`` (the text of ``module``; ``package``: its
    ``__init__``) names a method."""
    names, configs = method_packages_of()
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.STRING:
            try:
                value = ast.literal_eval(tok.string)
            except (ValueError, SyntaxError):  # an f-string part
                continue
            if isinstance(value, str) and value in names:
                found.append((tok.start[0], repr(value), names[value]))
            elif isinstance(value, str):
                found += [(tok.start[0], repr(value), configs[word]) for word in re.findall(r"\w+", value)
                          if word in configs]
        elif tok.type == tokenize.NAME and tok.string in configs:
            found.append((tok.start[0], tok.string, configs[tok.string]))
    home = module if package else module.rpartition(".")[0]  # what a relative import starts from
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = home.split(".")[: len(home.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module or ""
            targets = [target]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        for target in targets:
            hit = next((p for p in METHOD_PACKAGES if target == p or target.startswith(p + ".")), None)
            if hit:
                found.append((node.lineno, f"import {target}", hit))
    return found


def modules() -> dict[str, Path]:
    return {module_of(p): p for top in CHECKED for p in sorted((SRC / top.replace(".", "/")).rglob("*.py"))}


def test_the_command_line_planner_and_reports_name_no_method_outside_its_front_end():
    bad = []
    for module, path in modules().items():
        allowed = FRONT_ENDS.get(module, (None,))[0]
        for line, what, package in named(module, path.read_text(encoding="utf-8"), path.name == "__init__.py"):
            if package != allowed:
                where = "generic code" if allowed is None else f"the front end of {allowed}"
                bad.append(f"{path.relative_to(SRC)}:{line}: {what} names a method of {package} in {where}")
    assert not bad, "read it from the method's declaration or hooks instead:\n" + "\n".join(bad)


def test_every_front_end_is_checked_and_names_its_package():
    """An exemption that names nothing is stale; every listed module exists in the checked packages."""
    found = modules()
    for module, (package, _) in FRONT_ENDS.items():
        assert module in found and package in METHOD_PACKAGES, module
        assert any(p == package for _, _, p in named(module, found[module].read_text(encoding="utf-8"))), \
            f"{module} no longer names {package}: drop it from FRONT_ENDS"


@pytest.mark.parametrize("source, what", [
    ('def rank(method):\n    return method == "gqa"\n', "'gqa'"),
    ('NAMES = {"mechanism": 40}\n', "'mechanism'"),  # a former name is a name
    ("def f():\n    from ..conversion import convert_gqa\n", "import headwise.conversion"),
    ("import headwise.pruning.ranking\n", "import headwise.pruning.ranking"),
    ("x: L0Config | None = None\n", "L0Config"),
    ('FLAGS = {"GQAConfig.init": "--gqa-init"}\n', "'GQAConfig.init'"),
])
def test_a_method_named_in_generic_code_is_caught(source, what):
    assert [w for _, w, _ in named("headwise.planning.fake", source)] == [what]


def test_prose_and_field_names_are_not_method_names():
    source = 'HELP = "merge KV heads (gqa) or a latent"\nCOSTS = ("kv_heads", "flops")\nlabel = f"{name} gqa"\n'
    assert named("headwise.report.fake", source) == []
