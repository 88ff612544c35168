"""``headwise edit METHOD``: any method, its page read from its declaration (``headwise.contract.declarations``:
its summary, examples, former names; no torch) and its options built from the fields of its config.
``--kinds/--layers/--names`` are the selection of every method; the edited model is saved to ``DIR/model`` with
``DIR/edit.json`` (the method record ``{method, version, config}``)."""

from __future__ import annotations

import argparse
import sys

from ..errors import HeadwiseError
from . import model_args
from .options import add, config_options, output_args
from .task_options import load_task_model
from .output import print_json, write_json

SELECTION_FLAGS = ("kinds", "layers", "names")


def examples(lines) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


class MethodParsers(dict):
    """The ``METHOD`` sub-parsers of ``headwise edit``: each gets its options (the fields of the method's config, which
    import torch) when it is first looked up, i.e. when the method is chosen on the command line or read by a test;
    ``headwise edit --help`` only lists the names and summaries."""

    def __init__(self, methods: argparse._SubParsersAction, parents: list) -> None:
        super().__init__()
        self.built: set[str] = set()
        self.methods, self.parents = methods, parents
        self.adding = False

    def add(self, name: str, summary: str, hidden: bool = False) -> None:
        self.adding = True  # argparse asks whether the name is taken: only by what is already here
        try:
            q = self.methods.add_parser(name, parents=self.parents, description=summary,
                                        **({} if hidden else {"help": summary}))
        finally:
            self.adding = False
        q.set_defaults(run=run, method_name=name)

    def __contains__(self, name: object) -> bool:
        """Also a method registered in this process beyond the declared ones (a plugin's, a test's): it gets its
        parser on first look."""
        if super().__contains__(name) or self.adding:
            return super().__contains__(name)
        contract = sys.modules["headwise.contract"]  # imported by register
        if name not in contract.METHODS:
            return False
        self.add(name, contract.METHODS[name].summary)
        return True

    def __getitem__(self, name: str) -> argparse.ArgumentParser:
        if name not in self:
            raise KeyError(name)
        parser = super().__getitem__(name)
        if name not in self.built:
            self.built.add(name)
            method_options(parser, name)
        return parser

    def get(self, name, default=None):
        return self[name] if name in self else default

    def values(self):
        return [self[name] for name in self]

    def items(self):
        return [(name, self[name]) for name in self]


def register(verbs, parents) -> None:
    p = verbs.add_parser("edit", parents=parents, help="apply any registered method and save the model",
                         description="Apply one registered method (its options are the fields of its config;\n"
                                     "--kinds/--layers/--names select the sites) and save DIR/model with "
                                     "DIR/edit.json.\n`headwise edit METHOD --help` lists a method's options.")
    from ..contract import declarations

    methods = p.add_subparsers(dest="method", required=True, metavar="METHOD")
    methods.choices = methods._name_parser_map = parsers = MethodParsers(methods, parents)
    declared = declarations()
    for d in declared.values():
        parsers.add(d.name, d.summary)
    for d in declared.values():
        for old in d.aliases:  # former names: accepted (with a notice), not listed
            parsers.add(old, d.summary, hidden=True)
    p.epilog = examples(d.examples[0] for d in declared.values() if d.examples)


def method_options(q: argparse.ArgumentParser, name: str) -> None:
    """The options of ``headwise edit NAME``: the model, ``--task``, the selection, one per config field
    (``options.config_options``), ``--out``; the examples of its declaration below."""
    from ..contract import METHODS, config_fields, declarations

    declared = {alias: d for d in declarations().values() for alias in (d.name, *d.aliases)}
    method = declared.get(name) or METHODS[name].declaration
    model_args(q)
    add(q, "--task", default=None, shown="the base model, or the head a checkpoint was saved with")
    g = q.add_argument_group("selection (default: every site the method applies to)")
    for flag in SELECTION_FLAGS:
        add(g, f"--{flag}", default=None)
    taken = {"model", "device", "dtype", "out", "force", "task"}
    fields = [f.name for f, _ in config_fields(method.config)  # a config's `kinds=` is its selection's
              if f.name != "selection" and f.name not in SELECTION_FLAGS]
    clash = sorted(taken & set(fields))
    if clash:
        raise HeadwiseError(f"method {method.name!r}: config field {clash[0]!r} clashes with a shared option")
    config_options(q.add_argument_group(f"{method.config.__name__} (what is attached and recorded)"), method.config,
                   fields)
    output_args(q, None, "model/ and edit.json")
    q.description = f"{q.description}\n\ndocs: {method.doc or method.config.__module__.rsplit('.', 1)[0]}"
    if method.examples:
        q.epilog = examples(method.examples)


def run(args: argparse.Namespace) -> int:
    from ..contract import Selection, apply, config_fields, config_to_dict, method_named
    from ..io import atomic_dir, check_writable_dir, save_pretrained

    method = method_named(args.method_name)  # a former name works, with a notice
    values = {f.name: getattr(args, f.name) for f, _ in config_fields(method.config)
              if f.name != "selection" and f.name not in SELECTION_FLAGS and hasattr(args, f.name)}
    selection = Selection(**{k: getattr(args, k) for k in SELECTION_FLAGS})
    config = method.config(**values, selection=selection)  # validated before the model is loaded
    check_writable_dir(args.out, args.force)
    model, tokenizer = load_task_model(args, None)  # no tokenizer needed: a folder without one is taken as it is
    apply(model, config)
    record = config_to_dict(config)
    with atomic_dir(args.out, args.force) as tmp:
        save_pretrained(model, tmp / "model", tokenizer=tokenizer)
        write_json(tmp / "edit.json", record, indent=1)
    if args.json:
        print_json(record)
    else:
        print(f"{method.name}: saved {args.out}/model (reload with headwise.from_pretrained)")
    return 0
