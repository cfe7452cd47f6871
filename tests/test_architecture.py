"""The layering of ``src/ckptio`` and its size limits, checked on the source with ``ast`` (nothing is imported).

Every ``src/ckptio/**/*.py`` is parsed; every ``import x`` and ``from x import y`` becomes an edge from the module
that contains it to the ckptio module it names (relative imports resolved; ``from pkg import name`` points at
``pkg.name`` when that is a module, else at ``pkg``). Imports of parent packages that Python performs implicitly
are not edges: they run package ``__init__`` files, which the cycle rule would otherwise flag for every module.

Every import counts, for every rule: module level, inside functions, and under ``if TYPE_CHECKING:``.
A layer that may not depend on another may not even name its types; ``format/`` must stay readable without
``engine/``, whatever the import's position. And a function-level or TYPE_CHECKING import closes a circle just the
same for a reader: the two modules can no longer be understood, tested or moved one without the other, even though
Python would load them without a half-initialised module. ``Import.at_load`` only labels the edges in a report.

The rules (issue 07; the layers are drawn in the README's "How a save flows"):

* ``ckptio.format`` never imports ``ckptio.engine``: the on-storage contract has no processes.
* ``ckptio.storage`` never imports ``ckptio.engine``, ``ckptio.format`` or ``ckptio.policy``: it is the narrow
  protocol everything else is written against.
* ``ckptio.engine``, ``ckptio.format`` and ``ckptio.storage`` never import ``ckptio.testing`` (test tooling is
  not part of a save), and ``ckptio.testing`` never imports ``ckptio.demo`` (the demo uses the kit, never the
  reverse).
* No import cycle between modules, except the circles listed in ``KNOWN_CYCLES``.
* ``ckptio.engine.writer`` never imports ``ckptio.engine.trainer`` or ``ckptio.engine.restore``: the writer
  process talks to the trainer through ``engine.protocol``'s messages only, and must start without the trainer's
  or the restore's imports (issue 22).
* No module under ``src/`` longer than ``MAX_LINES``.
* No function or method anywhere under ``src/`` longer than ``MAX_FUNCTION_LINES``, except those listed in
  ``ALLOWED_LONG_FUNCTIONS``, each with its reason; only functions in the areas of ``ALLOWLIST_AREAS`` may be
  listed there, and an entry that no longer applies fails the test.
* No two modules under ``src/`` share a basename (``__init__`` and ``__main__`` apart): a name must say which
  module it is without its package, in a traceback, an import line or a search.
* No two sibling modules whose names are a couple of letters apart (one gets imported for the other).
* The package drawing of docs/architecture.md names every module of ``engine/`` and of its three rooms, and every
  trainer↔writer message of ``engine/protocol.py`` on its side: a drawing that is not checked drifts.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
ROOT_PACKAGE = "ckptio"
MAX_LINES = 400
MAX_FUNCTION_LINES = 50

ALLOWLIST_AREAS: tuple[str, ...] = ("ckptio.plan", "ckptio.demo.cluster", "ckptio.testing.cluster")
"""The only layers whose functions ``ALLOWED_LONG_FUNCTIONS`` may list: the ones another helper owns this round
(issue 22). Everywhere else a long function is split, not listed."""

# Functions over MAX_FUNCTION_LINES, by qualified name (module.Class.method, nested functions under <locals>), and
# why each is tolerated. The test fails on an entry that no longer applies, and on one outside ALLOWLIST_AREAS.
ALLOWED_LONG_FUNCTIONS: dict[str, str] = {
    "ckptio.plan.costs.background.predict_modes": "owned by another helper this round",
}

NOT_BASENAMES = frozenset({"__init__", "__main__"})
"""File names every package may have: they name their package, not themselves."""

# Known exceptions: modules over MAX_LINES when this test was written, each split by part A/B of issue 07.
# The lead empties this list when merging those splits; the test fails on an entry that no longer applies.
KNOWN_OVERSIZED: frozenset[str] = frozenset()

# Known import circles: (the modules of one circle, why it is tolerated for now). An entry must equal a strongly
# connected component of the import graph exactly, so a module that joins a known circle fails the test too; the
# test fails on an entry that no longer applies. The lead empties this list when the restructure lands.
KNOWN_CYCLES: tuple[tuple[frozenset[str], str], ...] = ()

# (importer layer, imported layer, why): a module in the first may never import a module in the second.
FORBIDDEN_LAYERS: tuple[tuple[str, str, str], ...] = (
    ("ckptio.format", "ckptio.engine", "the on-storage format has no processes"),
    ("ckptio.storage", "ckptio.engine", "storage is the narrow protocol below everything"),
    ("ckptio.storage", "ckptio.format", "storage is the narrow protocol below everything"),
    ("ckptio.storage", "ckptio.policy", "storage is the narrow protocol below everything"),
    ("ckptio.engine", "ckptio.testing", "test tooling is not part of a save"),
    ("ckptio.format", "ckptio.testing", "test tooling is not part of a save"),
    ("ckptio.storage", "ckptio.testing", "test tooling is not part of a save"),
    ("ckptio.testing", "ckptio.demo", "demo imports testing, never the reverse"),
    ("ckptio.engine.writer", "ckptio.engine.trainer", "the writer process hears the trainer through protocol.py only"),
    ("ckptio.engine.writer", "ckptio.engine.restore", "the writer process never restores"),
)


@dataclass(frozen=True)
class Import:
    """One import statement's target, as seen from the module that contains it."""

    target: str
    line: int
    at_load: bool
    """True when the import runs as the module loads: module level and not under ``if TYPE_CHECKING:``. Every rule
    counts both kinds; this only labels an edge in a report."""


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool


def discover(src: Path = SRC) -> dict[str, Module]:
    modules: dict[str, Module] = {}
    for path in sorted((src / ROOT_PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        name = ".".join(parts)
        modules[name] = Module(name, path, is_package)
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk_imports(body: Iterable[ast.stmt], at_load: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement under ``body``, with whether it runs as the module loads."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, at_load
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            # Nothing inside a function runs at load, TYPE_CHECKING or not.
            yield from ((inner, False) for inner in ast.walk(node) if isinstance(inner, (ast.Import, ast.ImportFrom)))
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _walk_imports(node.body, at_load=False)
            yield from _walk_imports(node.orelse, at_load)
        else:
            # Classes, try/with/if bodies at module level still run at load; nested functions do not.
            yield from _walk_imports(ast.iter_child_nodes(node), at_load)  # type: ignore[arg-type]


def _resolve_base(module: Module, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    package = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
    if node.level > 1:
        package = package[: len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def imports_of(module: Module, known: Mapping[str, Module]) -> list[Import]:
    """The ckptio modules ``module`` imports, one entry per imported name."""
    tree = ast.parse(module.path.read_text(), filename=str(module.path))
    found: list[Import] = []
    for node, at_load in _walk_imports(tree.body, at_load=True):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = _resolve_base(module, node)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        for target in targets:
            if target == ROOT_PACKAGE or target.startswith(ROOT_PACKAGE + "."):
                found.append(Import(_nearest_module(target, known), node.lineno, at_load))
    return found


def _nearest_module(target: str, known: Mapping[str, Module]) -> str:
    """``import ckptio.a.b`` where ``b`` is a name, not a module, still depends on ``ckptio.a``."""
    parts = target.split(".")
    while parts and ".".join(parts) not in known:
        parts.pop()
    return ".".join(parts) or target


def import_graph(src: Path = SRC) -> tuple[dict[str, Module], dict[str, list[Import]]]:
    modules = discover(src)
    return modules, {name: imports_of(module, modules) for name, module in modules.items()}


def in_layer(module: str, layer: str) -> bool:
    return module == layer or module.startswith(layer + ".")


def cyclic_components(graph: Mapping[str, Iterable[str]]) -> list[frozenset[str]]:
    """Every strongly connected component with a cycle in it (two or more modules, or one that imports itself),
    sorted by its smallest member; Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def strongconnect(start: str) -> None:
        # Iterative, so a long import chain cannot hit the recursion limit.
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(set(graph.get(start, ())))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(set(graph.get(succ, ()))))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    components.append(component)

    for node in sorted(graph):
        if node not in index:
            strongconnect(node)
    cyclic = [frozenset(c) for c in components if len(c) > 1 or c[0] in set(graph.get(c[0], ()))]
    return sorted(cyclic, key=min)


def find_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) per strongly connected component that has one."""
    return sorted(_cycle_through(min(members), set(members), graph) for members in cyclic_components(graph))


def _cycle_through(start: str, members: set[str], graph: Mapping[str, Iterable[str]]) -> list[str]:
    """A shortest path from ``start`` back to itself inside one strongly connected component (BFS)."""
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        next_frontier = []
        for node in frontier:
            for succ in sorted(set(graph.get(node, ()))):
                if succ not in members:
                    continue
                if succ == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if succ not in parents:
                    parents[succ] = node
                    next_frontier.append(succ)
        frontier = next_frontier
    raise AssertionError(f"{start} is not on a cycle")  # pragma: no cover - callers pass a cyclic component


@pytest.fixture(scope="module")
def graph() -> tuple[dict[str, Module], dict[str, list[Import]]]:
    return import_graph()


def test_source_tree_is_found(graph):
    modules, _ = graph
    # Guards the other tests against passing vacuously on an empty or mislocated tree.
    for expected in ("ckptio", "ckptio.engine.trainer.checkpointer", "ckptio.format.commit", "ckptio.storage.base"):
        assert expected in modules


def layer_offenders(modules: Mapping[str, Module], imports: Mapping[str, list[Import]], importer: str,
                    imported: str, root: Path = SRC.parent) -> list[str]:
    """``module (path:line) imports target`` for every import from layer ``importer`` into layer ``imported``."""
    return [f"{name} ({modules[name].path.relative_to(root)}:{imp.line}) imports {imp.target}"
            for name in sorted(imports) if in_layer(name, importer)
            for imp in imports[name] if in_layer(imp.target, imported)]


@pytest.mark.parametrize(("importer", "imported", "why"), FORBIDDEN_LAYERS,
                         ids=[f"{a.split('.')[-1]}-not-{b.split('.')[-1]}" for a, b, _ in FORBIDDEN_LAYERS])
def test_layering(graph, importer, imported, why):
    offenders = layer_offenders(*graph, importer, imported)
    assert not offenders, f"{importer} must not import {imported} ({why}):\n  " + "\n  ".join(offenders)


def cycle_problems(imports: Mapping[str, list[Import]],
                   known: Iterable[tuple[frozenset[str], str]] = KNOWN_CYCLES) -> list[str]:
    """A line per import circle that ``known`` does not list (with each edge's line, deferred imports marked), and
    one per entry of ``known`` that is no longer exactly a circle of the graph."""
    edges = {name: [imp for imp in found if imp.target != name] for name, found in imports.items()}
    graph = {name: [imp.target for imp in found] for name, found in edges.items()}
    known_sets = {members for members, _ in known}
    problems = []
    for members in cyclic_components(graph):
        if members in known_sets:
            continue
        cycle = _cycle_through(min(members), set(members), graph)
        steps = []
        for a, b in itertools.pairwise(cycle):
            imp = next(i for i in edges[a] if i.target == b)
            steps.append(f"{a} (line {imp.line}{'' if imp.at_load else ', deferred or TYPE_CHECKING'})")
        extra = f" [the circle holds {len(members)} modules: {', '.join(sorted(members))}]" \
            if len(members) > len(cycle) - 1 else ""
        problems.append("import cycle: " + " -> ".join([*steps, cycle[-1]]) + extra)
    current = set(cyclic_components(graph))
    problems += [f"stale KNOWN_CYCLES entry (not a circle of the graph): {sorted(m)}"
                 for m in sorted(known_sets - current, key=min)]
    return problems


def test_no_import_cycles(graph):
    _, imports = graph
    problems = cycle_problems(imports)
    assert not problems, "\n  ".join(["import circles (every import counts, deferred ones too):", *problems])


def test_modules_are_short(graph):
    modules, _ = graph
    lengths = {name: len(module.path.read_text().splitlines()) for name, module in modules.items()}
    too_long = {name: n for name, n in lengths.items() if n > MAX_LINES and name not in KNOWN_OVERSIZED}
    assert not too_long, f"modules over {MAX_LINES} lines: " + ", ".join(
        f"{modules[n].path.relative_to(SRC.parent)} ({lines})" for n, lines in sorted(too_long.items()))
    # An exception that no longer applies is removed, so the list cannot quietly shelter a new long module.
    stale = sorted(name for name in KNOWN_OVERSIZED if name in lengths and lengths[name] <= MAX_LINES)
    missing = sorted(name for name in KNOWN_OVERSIZED if name not in lengths)
    assert not stale and not missing, f"remove from KNOWN_OVERSIZED: {stale + missing}"


def long_functions(module: Module, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """The qualified name (``module.Class.method``; a nested function under ``outer.<locals>.inner``) and length
    of every function or method in ``module`` longer than ``limit`` lines (its ``def`` line through its last line,
    docstring included, decorators not)."""
    tree = ast.parse(module.path.read_text(), filename=str(module.path))
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}.{child.name}"
                length = (child.end_lineno or child.lineno) - child.lineno + 1
                if length > limit:
                    found[name] = length
                visit(child, f"{name}.<locals>")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}.{child.name}")
            else:
                visit(child, prefix)

    visit(tree, module.name)
    return found


def long_function_problems(modules: Mapping[str, Module], allowed: Mapping[str, str] = ALLOWED_LONG_FUNCTIONS,
                           areas: Iterable[str] = ALLOWLIST_AREAS, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """A line per function over ``limit`` that ``allowed`` does not list, per entry of ``allowed`` outside
    ``areas``, and per entry that names no function over ``limit`` (split, renamed or gone)."""
    found = {name: length for module in modules.values() for name, length in long_functions(module, limit).items()}
    areas = tuple(areas)
    problems = [f"{name} ({length} lines)" for name, length in sorted(found.items()) if name not in allowed]
    problems += [f"allowlisted outside {', '.join(areas)}: {name}" for name in sorted(allowed)
                 if not any(in_layer(name, area) for area in areas)]
    problems += [f"stale ALLOWED_LONG_FUNCTIONS entry (no function over {limit} lines): {name}"
                 for name in sorted(allowed) if name not in found]
    return problems


def test_functions_are_short(graph):
    modules, _ = graph
    problems = long_function_problems(modules)
    assert not problems, f"functions over {MAX_FUNCTION_LINES} lines:\n  " + "\n  ".join(problems)


def test_long_function_finder_counts_lines(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def short():\n    return 1\n\n\nclass C:\n    def long(self):\n" + "        x = 1\n" * 4)
    assert long_functions(Module("m", path, False), limit=4) == {"m.C.long": 5}
    assert long_functions(Module("m", path, False), limit=5) == {}


def test_long_function_rule_can_fail(tmp_path):
    deep_line = " " * 12 + "x = 1\n"
    modules, _ = _write_tree(tmp_path, {
        "plan/cost.py": "def big():\n" + "    x = 1\n" * 5,
        "engine/writer/flush.py": "class Flush:\n    def run(self):\n        def inner():\n" + deep_line * 5,
    })
    assert long_function_problems(modules, allowed={}, areas=("ckptio.plan",), limit=4) == [
        "ckptio.engine.writer.flush.Flush.run (7 lines)",
        "ckptio.engine.writer.flush.Flush.run.<locals>.inner (6 lines)",
        "ckptio.plan.cost.big (6 lines)",
    ]
    allowed = {"ckptio.plan.cost.big": "x", "ckptio.engine.writer.flush.Flush.run": "x", "ckptio.plan.gone": "x"}
    assert long_function_problems(modules, allowed=allowed, areas=("ckptio.plan",), limit=4) == [
        "ckptio.engine.writer.flush.Flush.run.<locals>.inner (6 lines)",
        "allowlisted outside ckptio.plan: ckptio.engine.writer.flush.Flush.run",
        "stale ALLOWED_LONG_FUNCTIONS entry (no function over 4 lines): ckptio.plan.gone",
    ]


def shared_basenames(modules: Mapping[str, Module]) -> list[str]:
    """``basename: module, module, ...`` for every file name (``NOT_BASENAMES`` apart) that two modules share."""
    by_basename: dict[str, list[str]] = {}
    for name, module in modules.items():
        if module.path.stem not in NOT_BASENAMES:
            by_basename.setdefault(module.path.stem, []).append(name)
    return [f"{base}: {', '.join(sorted(names))}" for base, names in sorted(by_basename.items()) if len(names) > 1]


def test_no_two_modules_share_a_basename(graph):
    modules, _ = graph
    shared = shared_basenames(modules)
    assert not shared, "modules that share a basename (rename one to say what it holds):\n  " + "\n  ".join(shared)


def test_shared_basename_rule_can_fail(tmp_path):
    modules, _ = _write_tree(tmp_path, {
        "engine/levels.py": "", "plan/levels.py": "", "plan/costs/levels.py": "", "plan/__main__.py": "",
        "demo/__main__.py": "", "demo/runner.py": "",
    })
    assert shared_basenames(modules) == ["levels: ckptio.engine.levels, ckptio.plan.costs.levels, ckptio.plan.levels"]


def test_writer_may_not_import_trainer_or_restore(tmp_path):
    modules, imports = _write_tree(tmp_path, {
        "engine/writer/pipeline.py": "from ckptio.engine import protocol\ndef late():\n"
                                     "    from ckptio.engine.restore.reader import R\n",
        "engine/writer/process.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                    "    from ckptio.engine.trainer.stager import S\n",
        "engine/protocol.py": "", "engine/restore/reader.py": "", "engine/trainer/stager.py": "",
    })
    offenders = [line for importer, imported, _ in FORBIDDEN_LAYERS if importer == "ckptio.engine.writer"
                 for line in layer_offenders(modules, imports, importer, imported, root=tmp_path)]
    assert offenders == [
        "ckptio.engine.writer.process (ckptio/engine/writer/process.py:3) imports ckptio.engine.trainer.stager",
        "ckptio.engine.writer.pipeline (ckptio/engine/writer/pipeline.py:3) imports ckptio.engine.restore.reader",
    ]


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance: the fewest letters inserted, deleted or replaced to turn ``a`` into ``b``."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, start=1):
        current = [i]
        for j, y in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def names_too_close(a: str, b: str) -> bool:
    """Two module names a reader may take one for the other: two edits or fewer apart, both five letters or more
    (short names such as ``s3`` and ``hf`` are naturally close and never confused)."""
    return min(len(a), len(b)) >= 5 and edit_distance(a, b) <= 2


def test_sibling_module_names_are_not_near_misses(graph):
    # Names two letters apart get imported one for the other: testing.s3server (moto) and testing.s3rver were.
    modules, _ = graph
    by_package: dict[str, list[str]] = {}
    for name in modules:
        package, _, leaf = name.rpartition(".")
        by_package.setdefault(package, []).append(leaf)
    close = [f"{package}.{a} / {package}.{b}" for package, leaves in sorted(by_package.items())
             for a, b in itertools.combinations(sorted(leaves), 2) if names_too_close(a, b)]
    assert not close, "sibling modules whose names differ by two letters or fewer: " + ", ".join(close)


ARCHITECTURE_DOC = SRC.parent / "docs" / "architecture.md"
DRAWN_PACKAGES = ("ckptio.engine", "ckptio.engine.trainer", "ckptio.engine.writer", "ckptio.engine.restore")
"""The packages whose every module the drawing in docs/architecture.md ("The pipeline's packages") names."""


def package_drawing(doc: Path = ARCHITECTURE_DOC) -> str:
    """The text block under docs/architecture.md's "The pipeline's packages" heading."""
    section = doc.read_text().split("## The pipeline's packages", 1)[1]
    return section.split("```", 2)[1]


def undrawn_modules(modules: Mapping[str, Module], drawing: str,
                    packages: Iterable[str] = DRAWN_PACKAGES) -> list[str]:
    """The modules directly in ``packages`` whose name the drawing never writes."""
    words = set(re.findall(r"\w+", drawing))
    packages = set(packages)
    return sorted(name for name, module in modules.items() if not module.is_package
                  and name.rpartition(".")[0] in packages and name.rpartition(".")[2] not in words)


def _message_union(name: str) -> list[str]:
    """The classes of ``engine.protocol``'s ``name = A | B | ...`` union."""
    tree = ast.parse((SRC / ROOT_PACKAGE / "engine" / "protocol.py").read_text())
    value = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and any(isinstance(target, ast.Name) and target.id == name for target in node.targets))
    return [node.id for node in ast.walk(value) if isinstance(node, ast.Name)]


def test_package_drawing_names_every_engine_module(graph):
    modules, _ = graph
    missing = undrawn_modules(modules, package_drawing())
    assert not missing, "docs/architecture.md's package drawing misses: " + ", ".join(missing)


def test_package_drawing_names_every_message_on_its_side():
    drawing = package_drawing()
    to_writer, _, from_writer = drawing.partition("writer → trainer:")
    to_writer = to_writer.partition("trainer → writer:")[2]
    for text, union in ((to_writer, "ToWriter"), (from_writer, "FromWriter")):
        words = set(re.findall(r"\w+", text))
        missing = [cls for cls in _message_union(union) if cls not in words]
        assert _message_union(union) and not missing, f"the drawing's {union} side misses: {missing}"


def test_undrawn_modules_are_found(tmp_path):
    modules, _ = _write_tree(tmp_path, {"engine/writer/pipeline.py": "", "engine/writer/flushes.py": "",
                                        "engine/partner/server.py": "", "format/keys.py": ""})
    drawing = "engine/writer/  pipeline ─▶ flush_pacer"
    assert undrawn_modules(modules, drawing) == ["ckptio.engine.writer.flushes"]


# --- the checker checks itself: each rule can fail -----------------------------------------------------------

def test_near_miss_names():
    assert edit_distance("s3server", "s3rver") == 2 and edit_distance("kitten", "sitting") == 3
    assert names_too_close("s3server", "s3rver") and names_too_close("probe", "probes")
    assert not names_too_close("moto_s3", "s3rver_s3") and not names_too_close("stager", "staging")
    assert not names_too_close("s3", "gs")


def test_cycle_finder_reports_cycles():
    graph = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": [], "e": ["e"], "f": ["g"], "g": []}
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["e", "e"]]
    assert cyclic_components(graph) == [frozenset("abc"), frozenset("e")]
    assert find_cycles({"a": ["b"], "b": ["c"], "c": []}) == []


def _write_tree(tmp_path: Path, files: Mapping[str, str]) -> tuple[dict[str, Module], dict[str, list[Import]]]:
    """A small ``ckptio`` package under ``tmp_path`` (every package gets an empty ``__init__``), and its graph."""
    for rel, text in files.items():
        path = tmp_path / ROOT_PACKAGE / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in [path.parent, *path.parent.parents]:
            if parent == tmp_path:
                break
            (parent / "__init__.py").touch()
        path.write_text(text)
    return import_graph(tmp_path)


def test_checker_sees_every_import_form(tmp_path):
    modules, imports = _write_tree(tmp_path, {
        "engine/writer.py": "from ckptio.format import keys\n",
        "format/keys.py": (
            "from __future__ import annotations\n"
            "from typing import TYPE_CHECKING\n"
            "from . import layout\n"
            "if TYPE_CHECKING:\n"
            "    from ..engine.writer import Writer\n"
            "def late():\n"
            "    import ckptio.engine\n"),
        "format/layout.py": "from .keys import thing\n",
    })

    by_target = {(imp.target, imp.at_load) for imp in imports["ckptio.format.keys"]}
    assert by_target == {("ckptio.format.layout", True), ("ckptio.engine.writer", False), ("ckptio.engine", False)}
    # The TYPE_CHECKING import of the writer joins it to the keys/layout circle.
    graph = {name: [imp.target for imp in found] for name, found in imports.items()}
    assert cyclic_components(graph) == [
        frozenset({"ckptio.engine.writer", "ckptio.format.keys", "ckptio.format.layout"})]
    assert layer_offenders(modules, imports, "ckptio.format", "ckptio.engine", root=tmp_path) == [
        "ckptio.format.keys (ckptio/format/keys.py:5) imports ckptio.engine.writer",
        "ckptio.format.keys (ckptio/format/keys.py:7) imports ckptio.engine",
    ]
    assert layer_offenders(modules, imports, "ckptio.engine", "ckptio.format", root=tmp_path) == [
        "ckptio.engine.writer (ckptio/engine/writer.py:1) imports ckptio.format.keys",
    ]


def test_cycle_rule_counts_deferred_and_type_checking_imports(tmp_path):
    _, imports = _write_tree(tmp_path, {
        # Each circle is closed by an import Python never runs at load: the old rule let both pass.
        "format/keys.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .records import R\n",
        "format/records.py": "from .keys import step_dir\n",
        "plan/probe.py": "from .targets import T\n",
        "plan/targets.py": "def clock():\n    from ckptio.plan.probe import Clock\n",
        "plan/alone.py": "import ckptio.plan.targets\n",
    })
    assert cycle_problems(imports, known=()) == [
        "import cycle: ckptio.format.keys (line 3, deferred or TYPE_CHECKING) -> ckptio.format.records (line 1)"
        " -> ckptio.format.keys",
        "import cycle: ckptio.plan.probe (line 1) -> ckptio.plan.targets (line 2, deferred or TYPE_CHECKING)"
        " -> ckptio.plan.probe",
    ]
    probe = frozenset({"ckptio.plan.probe", "ckptio.plan.targets"})
    assert cycle_problems(imports, known=[(probe, "tolerated")]) == [cycle_problems(imports, known=())[0]]


def test_known_cycles_must_stay_exact(tmp_path):
    _, imports = _write_tree(tmp_path, {
        "a.py": "import ckptio.b\n",
        "b.py": "def f():\n    import ckptio.c\n",
        "c.py": "import ckptio.a\n",
        "d.py": "import ckptio.a\n",
    })
    whole = frozenset({"ckptio.a", "ckptio.b", "ckptio.c"})
    assert cycle_problems(imports, known=[(whole, "tolerated")]) == []
    # A listed circle that a third module has joined no longer matches: the new circle is reported, and the
    # entry that no longer describes the graph is stale.
    part = frozenset({"ckptio.a", "ckptio.b"})
    problems = cycle_problems(imports, known=[(part, "tolerated")])
    assert problems == [
        "import cycle: ckptio.a (line 1) -> ckptio.b (line 2, deferred or TYPE_CHECKING) -> ckptio.c (line 1)"
        " -> ckptio.a",
        "stale KNOWN_CYCLES entry (not a circle of the graph): ['ckptio.a', 'ckptio.b']",
    ]
    gone = frozenset({"ckptio.d", "ckptio.e"})
    assert cycle_problems(imports, known=[(whole, "x"), (gone, "x")]) == [
        "stale KNOWN_CYCLES entry (not a circle of the graph): ['ckptio.d', 'ckptio.e']"]
