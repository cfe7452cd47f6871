"""The exception tree drawn in ``ckptio.errors``' docstring is held against the real classes.

A drawing nobody checks drifts (it had two ``└──`` in a row under ``StorageError``). The drawing is parsed —
each class's name, its depth (its parent is the nearest class drawn one level up) and the builtin named in
parentheses after it — and must match the classes exactly: every class drawn exists with the drawn parent and
builtin as its direct bases, every ``CkptError`` subclass is drawn, and the connectors are the ones a tree needs
(``└──`` only on a last child, a ``│`` stem only where a later sibling follows).
"""

from __future__ import annotations

import builtins
import re
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pytest

from ckptio import errors

_BRANCH = re.compile(r"^(?P<stems>(?:[│ ]   )*)(?P<connector>[├└]── )(?P<rest>.*)$")
_NODE = re.compile(r"^(?P<name>[A-Z]\w*)\s*(?:\((?P<builtin>\w+)\))?")


@dataclass
class Drawn:
    """One class as drawn: where it sits and what its line (and continuation lines) show."""

    name: str
    builtin: str | None
    depth: int
    line: int
    parent: Drawn | None = None
    children: list[Drawn] = field(default_factory=list)
    stems: str = ""
    connector: str = ""
    continuations: list[tuple[int, str]] = field(default_factory=list)
    """(line number, the leading tree characters) of each description line that wraps under this class."""


def drawing_of(doc: str) -> list[str]:
    """The literal block after ``::``: its lines with the block's indent removed."""
    lines = doc.splitlines()
    start = lines.index("::") + 1
    while not lines[start].strip():
        start += 1
    indent = len(lines[start]) - len(lines[start].lstrip())
    block = []
    for line in lines[start:]:
        if not line.strip():
            break
        block.append(line[indent:])
    return block


def parse_tree(drawing: list[str]) -> list[Drawn]:
    """Every class drawn, in drawing order; the first line is the root. Raises ``ValueError`` on a line that is
    neither a class nor a continuation, or a class more than one level below the previous one."""
    root_match = _NODE.match(drawing[0])
    if root_match is None:
        raise ValueError(f"line 1 names no class: {drawing[0]!r}")
    nodes = [Drawn(root_match["name"], root_match["builtin"], 0, 1)]
    path = [nodes[0]]  # the last class drawn at each depth, the current one last
    for number, text in enumerate(drawing[1:], start=2):
        branch = _BRANCH.match(text)
        if branch is None:
            # A wrapped description: only stems and spaces before its text.
            lead = re.match(r"^[│ ]*", text)
            assert lead is not None
            path[-1].continuations.append((number, lead.group()))
            continue
        node_match = _NODE.match(branch["rest"])
        if node_match is None:
            raise ValueError(f"line {number} has a connector but names no class: {text!r}")
        depth = len(branch["stems"]) // 4 + 1
        if depth > len(path):
            raise ValueError(f"line {number}: {node_match['name']} is drawn more than one level below its parent")
        parent = path[depth - 1]
        node = Drawn(node_match["name"], node_match["builtin"], depth, number, parent,
                     stems=branch["stems"], connector=branch["connector"][0])
        parent.children.append(node)
        nodes.append(node)
        del path[depth:]
        path.append(node)
    return nodes


def _has_later_sibling(node: Drawn) -> bool:
    return node.parent is not None and node.parent.children[-1] is not node


def _ancestry(node: Drawn) -> list[Drawn]:
    """The node's ancestors below the root, outermost first, then the node itself."""
    chain = []
    current: Drawn | None = node
    while current is not None and current.parent is not None:
        chain.append(current)
        current = current.parent
    return chain[::-1]


def _stem_columns(lead: str) -> set[int]:
    return {i // 4 for i, char in enumerate(lead) if char == "│"}


def drawing_problems(nodes: list[Drawn]) -> list[str]:
    """Connectors and stems that do not fit the tree the names describe."""
    problems = []
    for node in nodes[1:]:
        chain = _ancestry(node)
        expected = "├" if _has_later_sibling(node) else "└"
        if node.connector != expected:
            problems.append(f"line {node.line}: {node.name} is drawn with {node.connector}── but needs {expected}──")
        wanted = {i for i, above in enumerate(chain[:-1]) if _has_later_sibling(above)}
        if _stem_columns(node.stems) != wanted:
            problems.append(f"line {node.line}: the │ stems before {node.name} do not match its ancestors")
    for node in nodes:
        # A wrapped line keeps the stems of the node's ancestors with later siblings, its own if it has one, and
        # a stem down to its first child if it has children.
        chain = _ancestry(node)
        wanted = {i for i, above in enumerate(chain) if _has_later_sibling(above)}
        if node.children:
            wanted.add(len(chain))
        for number, lead in node.continuations:
            if _stem_columns(lead) != wanted:
                problems.append(f"line {number}: the │ stems under {node.name} do not match the tree")
    return problems


def _all_subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub} | _all_subclasses(sub)
    return found


def tree_problems(module: ModuleType, root: str = "CkptError") -> list[str]:
    """Everything on which the drawing in ``module``'s docstring and ``module``'s classes disagree."""
    nodes = parse_tree(drawing_of(module.__doc__ or ""))
    problems = drawing_problems(nodes)
    namespace: dict[str, Any] = vars(module)
    base = namespace[root]
    if nodes[0].name != root:
        problems.append(f"the drawing's root is {nodes[0].name}, not {root}")
    for node in nodes:
        cls = namespace.get(node.name)
        if not (isinstance(cls, type) and issubclass(cls, base)):
            problems.append(f"{node.name} is drawn but is not a {root} subclass in {module.__name__}")
            continue
        expected: list[type] = [namespace.get(node.parent.name, object) if node.parent else Exception]
        if node.builtin is not None:
            expected.append(getattr(builtins, node.builtin, object))
        if list(cls.__bases__) != expected:
            drawn = ", ".join(getattr(b, "__name__", "?") for b in expected)
            real = ", ".join(b.__name__ for b in cls.__bases__)
            problems.append(f"{node.name} is drawn as ({drawn}) but its bases are ({real})")
    drawn_names = {node.name for node in nodes}
    if len(drawn_names) != len(nodes):
        problems.append("a class is drawn twice")
    for cls in sorted(_all_subclasses(base) | {base}, key=lambda c: c.__name__):
        if cls.__name__ not in drawn_names:
            problems.append(f"{cls.__module__}.{cls.__name__} is a {root} subclass but is not drawn")
    return problems


# --- the real tree ---------------------------------------------------------------------------------------

def test_drawn_tree_matches_the_classes():
    assert tree_problems(errors) == []


def test_drawing_names_every_exported_error():
    # Guards the parse against passing vacuously: every public class is found in the drawing.
    drawn = {node.name for node in parse_tree(drawing_of(errors.__doc__ or ""))}
    assert drawn == set(errors.__all__)


def test_drawing_says_what_not_where_from():
    # The drawing explains each class; a tracker reference there goes stale (house rule: no "issue N" in src/).
    assert not re.search(r"\bissue \d", errors.__doc__ or "")


# --- the checker checks itself: each rule can fail ---------------------------------------------------------

def _fake_module(doc: str, extra: str = "") -> ModuleType:
    module = ModuleType("fake_errors", doc)
    # A fresh module per case, so a class one case adds is not a subclass in the next one.
    exec(
        "class CkptError(Exception): pass\n"
        "class ConfigError(CkptError, ValueError): pass\n"
        "class StorageError(CkptError, OSError): pass\n"
        "class NotFoundError(StorageError, FileNotFoundError): pass\n"
        "class FullError(StorageError): pass\n" + extra, vars(module))
    return module


GOOD = """Errors.

::

    CkptError                          base
    ├── ConfigError      (ValueError)  bad option
    └── StorageError     (OSError)     a storage operation failed,
        │                              wrapped over two lines
        ├── NotFoundError(FileNotFoundError)
        └── FullError                  no space
"""


def test_checker_accepts_a_faithful_drawing():
    assert tree_problems(_fake_module(GOOD)) == []


@pytest.mark.parametrize(("doc", "extra", "problem"), [
    (GOOD, "class LateError(CkptError): pass\n", "fake_errors.LateError is a CkptError subclass but is not drawn"),
    (GOOD, "class DeepError(FullError): pass\n", "fake_errors.DeepError is a CkptError subclass but is not drawn"),
    (GOOD.replace("ConfigError      (ValueError)", "ConfigError      (TypeError) "), "",
     "ConfigError is drawn as (CkptError, TypeError) but its bases are (CkptError, ValueError)"),
    (GOOD.replace("(FileNotFoundError)", "                   "), "",
     "NotFoundError is drawn as (StorageError) but its bases are (StorageError, FileNotFoundError)"),
    (GOOD.replace("        └── FullError ", "    └── FullError     "), "",
     "FullError is drawn as (CkptError) but its bases are (StorageError)"),
    (GOOD.replace("└── FullError", "└── GoneError"), "", "GoneError is drawn but is not a CkptError subclass"),
    (GOOD.replace("├── NotFoundError", "└── NotFoundError"), "",
     "line 5: NotFoundError is drawn with └── but needs ├──"),
    (GOOD.replace("        │       ", "                "), "", "line 4: the │ stems under StorageError"),
], ids=["undrawn", "undrawn-grandchild", "wrong-builtin", "missing-builtin", "wrong-parent", "not-a-class",
        "two-last-children", "broken-stem"])
def test_checker_reports(doc, extra, problem):
    problems = tree_problems(_fake_module(doc, extra))
    assert any(p.startswith(problem) for p in problems), problems
