"""The house's shape: no import circle anywhere in ``themis/`` (imports inside functions
included), none between its packages either (each package on its floor, arrows pointing down),
``lib/`` reached only from the one lazy factory, and no loose modules at the top.

The import graph is read from the source (an AST walk of every ``import`` statement: top level,
inside functions and methods, under ``if TYPE_CHECKING:``), not from ``sys.modules``, so a lazy
import that dodges a circle at run time still counts as the circle it is. An import from
another package also runs that package's ``__init__`` (``from themis.feedback.teachers import
x`` runs ``themis/feedback/__init__.py``): that is an edge too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "themis"

# The one module of themis/ that may import lib/ (lazily: channels, clips, explainers).
LIB_FACTORY = "themis.feedback.factory"
# The only modules allowed directly under themis/: the public API and the ground floor.
TOP_LEVEL_MODULES = {"__init__.py", "utils.py"}

# The floors of themis/, ground floor first: a package imports only packages on lower floors
# (packages on one floor do not import each other). ``themis`` is the public API
# (``themis/__init__.py``, lazy), ``utils`` the ground-floor module ``themis/utils.py``.
FLOORS: list[set[str]] = [
    {"utils"},  # seeding, devices, durable writes, ConfigError
    {"core"},  # the run's flat keys, mixed precision, safe loading, the terminal's progress bars
    {"environments", "tracking"},  # envs and suites; W&B / MLflow trackers
    {"agents"},  # SAC, PPO, networks, buffers, state entropy
    {"reward"},  # reward ensemble, preference dataset, Bradley-Terry trainer
    {"methods", "crowd"},  # PEBBLE's successors; label store, aggregation, audit
    {"feedback"},  # selector, teachers, channels, learner, factory (the one lib/ importer)
    {"run"},  # workspace, config, checkpoints, logging, evaluation, threads
    {"loops", "online"},  # the SAC and PPO loops; the wrapper for any RL library
    {"builder"},  # a config and a run dir -> the Workspace (entry points, tools, tests)
    {"cli"},  # the entry points of ./themis_train.sh and ./themis_pretrain.sh
    {"interpret", "themis"},  # run reports, reward inspection; the public API
    {"offline"},  # offline mode: datasets (rollouts among them), labels, IQL run, entry point
]


def module_name(path: Path, root: Path = ROOT) -> str:
    """Dotted name of a source file: ``themis/reward/trainer.py`` -> ``themis.reward.trainer``,
    ``themis/reward/__init__.py`` -> ``themis.reward``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules(package: Path = PACKAGE, root: Path = ROOT) -> dict[str, Path]:
    """Every module under ``package``: dotted name -> file."""
    return {module_name(path, root): path for path in sorted(package.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:``."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported_names(path: Path, name: str) -> dict[str, bool]:
    """Every module name ``path`` (module ``name``) imports, wherever the statement is, and
    whether the import runs (False: only under ``if TYPE_CHECKING:``).

    ``import a.b`` gives ``a.b``; ``from a import b`` gives ``a.b`` (the graph keeps ``a.b`` when
    it is a module, else ``a``), ``from a import *`` gives ``a``; relative imports are resolved
    against the module's package.
    """
    is_package = path.name == "__init__.py"
    package_parts = name.split(".") if is_package else name.split(".")[:-1]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    type_only = {id(inner) for node in ast.walk(tree)
                 if isinstance(node, ast.If) and _is_type_checking(node.test)
                 for statement in node.body for inner in ast.walk(statement)}
    names: dict[str, bool] = {}
    for node in ast.walk(tree):
        found: list[str] = []
        if isinstance(node, ast.Import):
            found = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package_parts[: len(package_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found = [base if alias.name == "*" else f"{base}.{alias.name}"
                     for alias in node.names]
        for target in found:
            names[target] = names.get(target, False) or id(node) not in type_only
    return names


def import_graph(package: Path = PACKAGE, root: Path = ROOT) -> nx.DiGraph:
    """Directed graph of ``package``'s modules: an edge ``a -> b`` when ``a`` imports ``b``.

    ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``
    (whose ``__init__`` provides the name). An import that runs (at the top, or later inside a
    function) of ``x.y.z`` also runs the ``__init__`` of ``x`` and ``x.y``: edges too, except to
    the importer's own enclosing packages (already running when its code runs); an import under
    ``if TYPE_CHECKING:`` runs nothing and is an edge to the module it names only. Imports of
    anything outside ``package`` are left out.
    """
    modules = source_modules(package, root)
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        own = {".".join(name.split(".")[:end]) for end in range(1, name.count(".") + 1)}
        if path.name == "__init__.py":
            own.add(name)
        for target, runs in imported_names(path, name).items():
            if target not in modules:  # a name from a package's __init__, or not ours
                target = target.rpartition(".")[0]
            if target not in modules:
                continue
            graph.add_edge(name, target)
            parts = target.split(".")
            for end in range(1, len(parts) if runs else 0):
                if ".".join(parts[:end]) not in own:
                    graph.add_edge(name, ".".join(parts[:end]))
    graph.remove_edges_from(list(nx.selfloop_edges(graph)))
    return graph


def package_of(module: str) -> str:
    """The package of ``themis/`` a module is in: ``themis.reward.ensemble`` -> ``reward``,
    ``themis.reward`` -> ``reward``, ``themis.utils`` -> ``utils``, ``themis`` -> ``themis``
    (the public API)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_graph(graph: nx.DiGraph) -> nx.DiGraph:
    """The module graph collapsed to packages: an edge ``a -> b`` when a module of ``a``
    imports one of ``b`` (every kind of import the module graph holds). Each edge's
    ``example`` is one such module edge, a module's rather than a package ``__init__``'s
    when there is one."""
    packages = nx.DiGraph()
    packages.add_nodes_from(package_of(name) for name in graph)
    for a, b in sorted(graph.edges, key=lambda edge: (edge[1] in _packages(graph), edge)):
        pa, pb = package_of(a), package_of(b)
        if pa != pb and not packages.has_edge(pa, pb):
            packages.add_edge(pa, pb, example=(a, b))
    return packages


def _packages(graph: nx.DiGraph) -> set[str]:
    """The nodes of ``graph`` that are packages (``themis.reward``), not modules in them."""
    return {name for name in graph if any(other.startswith(name + ".") for other in graph)}


def _arrow(packages: nx.DiGraph, a: str, b: str) -> str:
    first, second = packages.edges[a, b]["example"]
    return f"{a} -> {b} ({first} imports {second})"


def lib_importers(package: Path = PACKAGE, root: Path = ROOT) -> set[str]:
    """The modules under ``package`` with any import statement of ``lib`` or ``lib.*``."""
    return {name for name, path in source_modules(package, root).items()
            if any(target == "lib" or target.startswith("lib.")
                   for target in imported_names(path, name))}


# ---------------------------------------------------------------- the checks
def test_no_import_circle():
    """No module of themis/ reaches itself through imports, lazy ones included."""
    graph = import_graph()
    assert graph.number_of_nodes() > 50  # the walk found the package
    cycles = sorted(nx.simple_cycles(graph), key=len)
    assert not cycles, "import circle(s):\n" + "\n".join(
        " -> ".join([*cycle, cycle[0]]) for cycle in cycles[:10])


def test_no_package_circle():
    """No package of themis/ reaches itself through its modules' imports (a module circle is
    not needed: ``a.x -> b.y -> a.z`` is a circle of packages ``a`` and ``b``)."""
    packages = package_graph(import_graph())
    cycles = sorted(nx.simple_cycles(packages), key=lambda cycle: (len(cycle), cycle))
    assert not cycles, "package circle(s):\n" + "\n".join(
        ";  ".join(_arrow(packages, a, b) for a, b in zip(cycle, [*cycle[1:], cycle[0]],
                                                          strict=True))
        for cycle in cycles[:10])


def test_arrows_point_down_the_floors():
    """Every package has a floor, and imports only packages on lower floors."""
    floor = {package: level for level, names in enumerate(FLOORS) for package in names}
    packages = package_graph(import_graph())
    assert set(packages) == set(floor), "give each package a floor in FLOORS: " \
        f"new {sorted(set(packages) - set(floor))}, gone {sorted(set(floor) - set(packages))}"
    up = [_arrow(packages, a, b) for a, b in sorted(packages.edges)
          if floor[b] >= floor[a]]
    assert not up, "arrows that do not point down the floors:\n" + "\n".join(up)


def test_only_the_factory_imports_lib():
    """Arrows point one way: lib/ uses themis/; themis/ imports lib/ only in the lazy factory."""
    assert lib_importers() == {LIB_FACTORY}


def test_the_builder_is_imported_from_the_builder_not_from_the_entry_point():
    """Tools, scripts, benchmarks, lib/ and the tests build a run with
    ``themis.builder.make_workspace``; only the tests of the command line import
    ``themis.cli`` (and no one imports ``make_workspace`` from there)."""
    offenders = []
    for folder in ("themis", "lib", "scripts", "benchmarks", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.is_relative_to(PACKAGE / "cli"):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not (isinstance(node, ast.ImportFrom) and node.module
                        and node.module.startswith("themis.cli")):
                    continue
                names = {alias.name for alias in node.names}
                if folder != "tests" or "make_workspace" in names:
                    offenders.append(f"{path.relative_to(ROOT)}: from {node.module} import "
                                     f"{', '.join(sorted(names))}")
    assert not offenders, "import the builder from themis.builder:\n" + "\n".join(offenders)


def test_no_loose_top_level_modules():
    """themis/ holds packages, the public API (__init__.py) and the ground floor (utils.py)."""
    loose = {path.name for path in PACKAGE.glob("*.py")} - TOP_LEVEL_MODULES
    assert not loose, f"put these in a package named for what they are: {sorted(loose)}"
    # every folder with code is a package (an __init__.py), so the walk and imports see it
    folders = {path.parent for path in PACKAGE.rglob("*.py")}
    assert all((folder / "__init__.py").exists() for folder in folders)


# ---------------------------------------------------------------- the checker itself
def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / "pkg"


@pytest.mark.parametrize("statement", [
    "from pkg.a import f",        # top level
    "def g():\n    from pkg.a import f\n",           # lazy, inside a function
    "class C:\n    def m(self):\n        import pkg.a\n",  # inside a method
    "from . import a",            # relative, a submodule
    "from .a import f",           # relative
    "def g():\n    from .sub import x\n",  # through a package's __init__ (x is no module)
    "def g():\n    from pkg.sub.leaf import y\n",  # running pkg/sub/__init__ on the way
    "if TYPE_CHECKING:\n    from pkg.a import f\n",  # type-only: still a dependency
])
def test_the_walk_sees_every_kind_of_import(tmp_path, statement):
    """A circle is found however its back edge is written."""
    package = write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import g\n",
        "pkg/b.py": statement + "\n",
        "pkg/sub/__init__.py": "from pkg.a import f as x\n",
        "pkg/sub/leaf.py": "y = 1\n",
    })
    graph = import_graph(package, tmp_path)
    assert any("pkg.a" in cycle and "pkg.b" in cycle for cycle in nx.simple_cycles(graph))


def test_the_walk_finds_no_circle_where_there_is_none(tmp_path):
    package = write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import g\nimport os\nfrom typing import Any\n",
        "pkg/b.py": "def g():\n    import pkg.c\n    from lib.x import y\n",
        "pkg/c.py": "",
    })
    assert not list(nx.simple_cycles(import_graph(package, tmp_path)))
    assert lib_importers(package, tmp_path) == {"pkg.b"}


def test_the_package_graph_finds_a_circle_through_a_lazy_import(tmp_path):
    """``a.x -> b.y`` and a lazy ``b.z -> a.w``: no module circle, but a package circle, whose
    arrows each name a module edge."""
    package = write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a/__init__.py": "",
        "pkg/a/x.py": "from pkg.b.y import f\n",
        "pkg/a/w.py": "g = 1\n",
        "pkg/b/__init__.py": "",
        "pkg/b/y.py": "f = 1\n",
        "pkg/b/z.py": "def h():\n    from pkg.a.w import g\n",
        "pkg/c.py": "from pkg.b.y import f\n",
    })
    modules = import_graph(package, tmp_path)
    assert not list(nx.simple_cycles(modules))
    packages = package_graph(modules)
    assert sorted(map(sorted, nx.simple_cycles(packages))) == [["a", "b"]]
    assert packages.edges["a", "b"]["example"] == ("pkg.a.x", "pkg.b.y")
    assert packages.edges["b", "a"]["example"] == ("pkg.b.z", "pkg.a.w")
    assert _arrow(packages, "c", "b") == "c -> b (pkg.c imports pkg.b.y)"


def test_a_package_init_is_run_by_imports_from_outside_it_only(tmp_path):
    """``pkg.sub.leaf`` imported from outside runs ``pkg/sub/__init__`` (an edge); from inside
    ``pkg.sub`` it does not (the package is already running), nor under TYPE_CHECKING."""
    package = write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.sub.leaf import y\n",
        "pkg/t.py": "if TYPE_CHECKING:\n    from pkg.sub.leaf import y\n",
        "pkg/sub/__init__.py": "from pkg.sub.leaf import y\nfrom pkg.sub.other import z\n",
        "pkg/sub/leaf.py": "y = 1\n",
        "pkg/sub/other.py": "from pkg.sub.leaf import y\nz = y\n",
    })
    graph = import_graph(package, tmp_path)
    assert graph.has_edge("pkg.a", "pkg.sub") and graph.has_edge("pkg.a", "pkg.sub.leaf")
    assert not graph.has_edge("pkg.sub.other", "pkg.sub")
    assert set(graph.successors("pkg.t")) == {"pkg.sub.leaf"}
    assert not list(nx.simple_cycles(graph))


def test_the_launchers_import_neither_pandas_nor_scipy_before_they_are_used():
    """A typo on the command line gets its one line in about 2 s, not 3.4: pandas (0.3 s) and
    scipy.stats (0.45 s) are imported where a run first uses them (saving preferences, the
    held-out correlations, Dawid–Skene), not by the entry points."""
    code = ("import sys, themis.cli.train, themis.cli.pretrain; "
            "print(sorted(m for m in ('pandas', 'scipy', 'matplotlib') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


# ---------------------------------------------------------------------- no CPU scheduler
MACHINE_WIDE = {"flock": "a lock shared with other processes", "lockf": "the same",
                "mallopt": "glibc's allocator, set process-wide behind the user's back"}


def machine_wide_uses(path: Path) -> list[str]:
    """What a module does that couples it to other processes on the machine: reads of
    ``/proc/stat`` (the machine's load) and the calls of :data:`MACHINE_WIDE` (docstrings and
    comments do not count)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef |
                                ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and "/proc/stat" in node.value and id(node) not in docstrings:
            found.append(f"line {node.lineno}: reads /proc/stat")
        name = node.attr if isinstance(node, ast.Attribute) else \
            node.id if isinstance(node, ast.Name) else None
        if name in MACHINE_WIDE:
            found.append(f"line {node.lineno}: {name} ({MACHINE_WIDE[name]})")
        if isinstance(node, ast.ImportFrom):
            found += [f"line {node.lineno}: imports {a.name}" for a in node.names
                      if a.name in MACHINE_WIDE]
    return found


def test_no_module_reads_the_machines_load_or_takes_machine_wide_locks():
    """A run's thread count and speed do not depend on what else runs (issue 62): nothing in
    themis/ reads /proc/stat, takes a file lock or sets malloc's thresholds."""
    found = {name: uses for name, path in source_modules().items()
             if (uses := machine_wide_uses(path))}
    assert found == {}


def test_the_scan_sees_each_machine_wide_use(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('"""Reads /proc/stat."""\nimport fcntl\nfrom fcntl import lockf\n'
                   'open("/proc/stat")\nfcntl.flock(3, fcntl.LOCK_EX)\nlibc.mallopt(-1, 0)\n')
    assert sorted(machine_wide_uses(bad)) == [  # the docstring does not count
        "line 3: imports lockf", "line 4: reads /proc/stat",
        "line 5: flock (a lock shared with other processes)",
        "line 6: mallopt (glibc's allocator, set process-wide behind the user's back)"]


def test_a_run_leaves_nothing_in_the_temporary_folder(compose, tmp_path, monkeypatch):
    """A run keeps its files in its run dir: no lock folder or pipe in $TMPDIR that would
    couple it to other runs (and test runs) on the machine."""
    import tempfile

    from tests.conftest import TINY_PENDULUM
    from themis.builder import make_workspace
    from themis.run.closing import finish

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    ws = make_workspace(compose([*TINY_PENDULUM, "num_train_steps=600"]), tmp_path / "run")
    ws.run()  # seed steps, pretraining, a feedback round, SAC updates, an evaluation
    finish(ws)
    assert ws.step == 600 and ws.total_feedback > 0
    # PyTorch's own cache folder (torch._inductor's default, made when torch.optim loads it)
    # holds no lock and is PyTorch's; anything else is a run's
    assert sorted(p.name for p in temp.iterdir() if not p.name.startswith("torchinductor_")) \
        == []



# Where a config is still being written: inspection turns a finished run's config into an
# inspection run's.
CONFIG_WRITERS = {"themis.interpret.inspection"}


def config_assignments(path: Path) -> list[int]:
    """Lines of every assignment to a config's key (``cfg.x = ...``, ``cfg.x += ...``,
    ``cfg["x"] = ...``, ``setattr(cfg, ...)``; ``cfg`` or ``cfg_obj``) in one source file."""
    names = {"cfg", "cfg_obj"}
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = [t for target in node.targets for t in
                       (target.elts if isinstance(target, ast.Tuple) else [target])]
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "setattr" and node.args:
            targets = [ast.Attribute(value=node.args[0], attr="?")]
        found += [node.lineno for target in targets
                  if isinstance(target, ast.Attribute | ast.Subscript)
                  and isinstance(target.value, ast.Name) and target.value.id in names]
    return sorted(found)


def test_nothing_assigns_to_a_config_once_it_is_resolved():
    """The config is resolved once (themis.run.resolve: threads, a snapshot's schedule,
    reward_batch=auto, resume) into a new object; validation, the builder, the entry points
    and the loops never assign to it (issue 62, step 2)."""
    found = [f"{path.relative_to(ROOT)}:{line}" for name, path in source_modules().items()
             if name not in CONFIG_WRITERS for line in config_assignments(path)]
    assert found == []


def test_the_config_scan_sees_each_kind_of_assignment(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("cfg.a = 1\ncfg.b += 1\ncfg['c'] = 1\nsetattr(cfg, 'd', 1)\n"
                      "cfg_obj.e, x = 1, 2\nother.f = 1\nx = cfg.g\ncfg = other\n")
    assert config_assignments(source) == [1, 2, 3, 4, 5]


MOST_UNTYPED_CONFIGS = 0
"""``cfg: Any`` in ``themis/`` and ``lib/`` (issue 86 item 2: 56 before): a config is typed
where it is read (:class:`themis.core.run_keys.RunKeys` below the run floor,
:class:`themis.run.config.TrainConfig` on it and above, a group where one is read)."""


def untyped_configs(root: Path = ROOT) -> list[str]:
    """``path:line`` of every ``cfg: Any`` (also ``run_cfg: Any``) in ``themis/`` and ``lib/``."""
    return [f"{path.relative_to(root)}:{number}"
            for folder in ("themis", "lib") for path in sorted((root / folder).rglob("*.py"))
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if "cfg: Any" in line]


def test_configs_are_typed_where_they_are_read():
    """A contributor jumps from ``cfg.reward_batch`` to its field, its range and its docstring,
    and mypy checks the read: ``cfg: Any`` stays at :data:`MOST_UNTYPED_CONFIGS`."""
    found = untyped_configs()
    assert len(found) <= MOST_UNTYPED_CONFIGS, \
        "type these configs (RunKeys, TrainConfig or the group read):\n" + "\n".join(found)


def test_the_untyped_config_scan_sees_each_site(tmp_path):
    (tmp_path / "themis").mkdir()
    (tmp_path / "lib").mkdir()
    (tmp_path / "themis" / "a.py").write_text("def f(cfg: Any) -> None: ...\nx: Any = 1\n")
    (tmp_path / "lib" / "b.py").write_text("def g(run_cfg: Any, cfg: RunKeys) -> None: ...\n")
    assert untyped_configs(tmp_path) == ["themis/a.py:1", "lib/b.py:1"]


def function_callers(name: str, root: Path = ROOT) -> set[str]:
    """The files of ``themis/`` and ``lib/`` that call a function ``name`` (``name(...)`` or
    ``module.name(...)``)."""
    return {str(path.relative_to(root))
            for folder in ("themis", "lib") for path in sorted((root / folder).rglob("*.py"))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Call) and name in (
                getattr(node.func, "id", None), getattr(node.func, "attr", None))}


def test_the_methods_are_checked_by_validation_alone():
    """``check_methods`` (what the switched-on methods cannot run with) is called by
    ``themis/run/validation.py`` only: the run's resolution and the wrapper's ask validation
    (issue 86 item 2: it was called from five places)."""
    assert function_callers("check_methods") == {"themis/run/validation.py"}


def test_the_caller_scan_sees_calls_and_not_definitions(tmp_path):
    (tmp_path / "themis").mkdir()
    (tmp_path / "lib").mkdir()
    (tmp_path / "themis" / "a.py").write_text("def check_methods(cfg): ...\n")
    (tmp_path / "themis" / "b.py").write_text("registry.check_methods(cfg)\n")
    (tmp_path / "lib" / "c.py").write_text("from x import check_methods\ncheck_methods(c)\n")
    assert function_callers("check_methods", tmp_path) == {"themis/b.py", "lib/c.py"}


def workspace_names(path: Path) -> set[str]:
    """The ``ws.<name>`` attributes a loop module reads or writes."""
    return {node.attr for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id == "ws"}


def test_the_workspace_holds_components_and_the_loops_read_few_of_its_names():
    """Issue 62, step 4: the Workspace keeps components, counters and ``state_dict`` (at most
    400 lines; console text, checkpoint, snapshot and closing I/O live in their modules), and
    each loop reads fewer than 25 of its names."""
    assert len((PACKAGE / "run" / "workspace.py").read_text().splitlines()) <= 400
    for loop in ("pebble", "prefppo"):
        names = workspace_names(PACKAGE / "loops" / f"{loop}.py")
        assert len(names) < 25, (loop, sorted(names))


def test_the_name_scan_counts_each_workspace_name_once(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("ws.step += 1\nx = ws.step\nws.cfg.seed\nother.ws.agent\nws.run(ws.env)\n")
    assert workspace_names(source) == {"step", "cfg", "run", "env"}


def learner_branches(path: Path) -> list[str]:
    """Where a module asks which learner it has: a ``cast(PreferenceLearner, ...)``, a
    ``remote`` name or attribute, or an ``isinstance`` against a learner class."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Name) and node.id == "remote") or \
                (isinstance(node, ast.Attribute) and node.attr == "remote"):
            found.append(f"{node.lineno}: remote")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("cast", "isinstance") and any(
                    isinstance(a, ast.Name) and a.id.endswith("Learner") for a in node.args):
            found.append(f"{node.lineno}: {node.func.id}")
    return found


LEARNER_USERS = ("loops/pebble.py", "loops/prefppo.py", "run/workspace.py", "run/closing.py",
                 "run/plan.py")


def test_the_loops_and_the_workspace_see_one_learner_protocol():
    """Issue 86, item 1: the loops and the Workspace call the learner through
    ``themis.run.protocols.RunLearner`` and never ask which one they have."""
    found = {name: learner_branches(PACKAGE / name) for name in LEARNER_USERS}
    assert not any(found.values()), found


def test_the_learner_branch_scan_sees_each_kind(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("remote = ws.remote\nx = cast(PreferenceLearner, y)\n"
                      "isinstance(a, AsyncLearner)\ncast(int, y)\nlearner.round()\n")
    assert learner_branches(source) == ["1: remote", "1: remote", "2: cast", "3: isinstance"]


@pytest.mark.parametrize("learner", ["themis.feedback.learner:PreferenceLearner",
                                     "themis.online.loop:AsyncLearner"])
def test_both_learners_answer_every_call_of_the_protocol_with_its_signature(learner):
    """mypy checks the same where the builder and the Workspace hand a learner over; this
    names the call that drifted."""
    import importlib
    import inspect

    from themis.run.protocols import RunLearner

    module, name = learner.split(":")
    cls = getattr(importlib.import_module(module), name)
    members = [m for m in vars(RunLearner) if not m.startswith("_")]
    members += list(RunLearner.__annotations__)
    assert {"observe", "feedback_round", "round_due", "first_model_pending"} <= set(members)
    assert isinstance(getattr(cls, "checkpoint_after_round", None), bool), name
    for member in members:
        proto = getattr(RunLearner, member, None)
        if callable(proto):
            ours = getattr(cls, member, None)
            assert callable(ours), f"{name}.{member} is missing"
            assert list(inspect.signature(ours).parameters)[:len(
                inspect.signature(proto).parameters)] == list(
                inspect.signature(proto).parameters), f"{name}.{member}: its parameters differ"


def module_map_gaps(doc: str, root: Path = ROOT) -> list[str]:
    """Modules of ``themis/`` and ``lib/`` that the module map (a table of ``| `pkg/` | ... |``
    rows in docs/developing/how-it-works.md) does not name in their package's row."""
    rows: dict[str, str] = {}
    for line in doc.splitlines():
        cells = line.split("|")
        if len(cells) > 3 and cells[1].strip().startswith("`") and cells[1].strip().endswith("/`"):
            rows[cells[1].strip().strip("`")] = "|".join(cells[2:])
    gaps = []
    for module in sorted([*(root / "themis").rglob("*.py"), *(root / "lib").glob("*.py")]):
        if module.name == "__init__.py":
            continue
        package = module.parent.relative_to(root).as_posix() + "/"
        if module.name not in rows.get(package, ""):
            gaps.append(f"{package}{module.name}")
    return gaps


def test_every_module_is_on_the_module_map():
    """A newcomer finds each module's job on the map (issue 86: six were missing)."""
    gaps = module_map_gaps((ROOT / "docs" / "developing" / "how-it-works.md").read_text())
    assert not gaps, f"add to the module map in docs/developing/how-it-works.md: {gaps}"


def test_the_module_map_check_sees_a_missing_module(tmp_path):
    (tmp_path / "themis" / "agents").mkdir(parents=True)
    (tmp_path / "lib").mkdir()
    for name in ("themis/agents/sac.py", "themis/agents/ppo.py", "themis/utils.py"):
        (tmp_path / name).write_text("")
    doc = "| `themis/agents/` | `sac.py` (SAC) |\n| `themis/` | `utils.py` |\n"
    assert module_map_gaps(doc, tmp_path) == ["themis/agents/ppo.py"]
