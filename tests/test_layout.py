"""labutils' layout rules, checked statically (ast over every module; nothing is imported).

* no import cycle, counting every import: module level, inside functions, relative and absolute;
* no private name (``_x``) imported from, or used as an attribute of, another labutils module;
* no re-export: outside a package's ``__init__``, a name imported from labutils is used where it
  is imported (a module made only of such imports is the plain case);
* the top level holds the core only: no module named for a lab or for the benchmark (those live
  in ``labs/labNN_topic/`` and ``bench/``);
* dependencies run one way, labs -> instruments -> core: nothing in the core (the top level,
  ``pool/``, ``debugging/``), ``instruments/``, ``bench/`` or ``commands/`` imports ``labs``, ``checks``
  or ``solutions``, the labs import neither ``checks`` nor ``solutions``, and the core does not import
  ``instruments`` (function-level imports count);
* torch's private names (``torch._x``, ``torch.utils._x``, ...) are reached only through ``compat``.

The detector is unit-tested on small synthetic packages, so that each rule is seen to fail.
"""
from __future__ import annotations

import ast
import dataclasses
import re
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "labutils"
CORE = {"__init__", "__main__", "_rank", "launch", "procs", "rendezvous", "config", "errors", "compat",
        "pickling", "nccl_groups", "timing", "bandwidth", "hw", "recorded", "plots", "claims", "notebook_source"}
# a top-level module must not be named for a lab's topic or for the benchmark
LAB_OR_BENCH = re.compile(r"^(bench|lab\d*|tp|tensor|p2p|pipeline|cudacomm|cuda|copybw|overlap)(_|$)")


@dataclasses.dataclass
class Module:
    name: str            # dotted, e.g. "labutils.bench.ops"
    path: Path
    is_package: bool     # an __init__.py
    tree: ast.Module


def load(root: Path) -> dict[str, Module]:
    """Every module of the package in ``root`` (a folder with ``__init__.py``), by dotted name."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        name = ".".join(parts)
        out[name] = Module(name, path, is_package, ast.parse(path.read_text(), str(path)))
    return out


def _base(mod: Module, node: ast.ImportFrom) -> str:
    """The absolute module named by ``from <module> import ...`` in ``mod``."""
    if not node.level:
        return node.module or ""
    package = mod.name if mod.is_package else mod.name.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def imports(mod: Module, modules: dict[str, Module]):
    """``(target module, imported name or None, bound name, line)`` for every import in ``mod``
    that reaches a module of the package; ``from pkg import sub`` targets ``pkg.sub``."""
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    bound = alias.asname or alias.name.split(".")[0]
                    yield alias.name, None, bound, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = _base(mod, node)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in modules:
                    yield sub, None, alias.asname or alias.name, node.lineno
                elif base in modules:
                    yield base, alias.name, alias.asname or alias.name, node.lineno


def cycles(modules: dict[str, Module]) -> list[list[str]]:
    """Import cycles (each once, as a path that returns to its start)."""
    graph = {name: sorted({t for t, *_ in imports(m, modules) if t != name}) for name, m in modules.items()}
    found, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    return found


def private_uses(modules: dict[str, Module]) -> list[str]:
    """``from .x import _name`` and ``x._name`` where ``x`` is another module of the package."""
    private = re.compile(r"^_(?!_)")  # _name, but not __dunder__
    bad = []
    for mod in modules.values():
        bound_modules = {}
        for target, name, bound, line in imports(mod, modules):
            if target == mod.name:
                continue
            if name is None:
                bound_modules[bound] = target
            elif private.match(name):
                bad.append(f"{mod.name}:{line} imports {name} from {target}")
        for node in ast.walk(mod.tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in bound_modules and private.match(node.attr)):
                bad.append(f"{mod.name}:{node.lineno} uses {bound_modules[node.value.id]}.{node.attr}")
    return bad


def reexports(modules: dict[str, Module]) -> list[str]:
    """Names a module (other than a package's ``__init__``) imports from the package and never uses:
    they are there for others to import, i.e. re-exported."""
    bad = []
    for mod in modules.values():
        if mod.is_package:
            continue
        used = {n.id for n in ast.walk(mod.tree) if isinstance(n, ast.Name)}
        for target, name, bound, line in imports(mod, modules):
            if bound not in used and "." not in bound:
                bad.append(f"{mod.name}:{line} re-exports {target}{'.' + name if name else ''}")
    return bad


def top_level_misfits(modules: dict[str, Module], package: str) -> list[str]:
    """Top-level modules of ``package`` that are named for a lab or the benchmark, or that are not
    in the core list."""
    bad = []
    for name, mod in modules.items():
        head, _, rest = name.partition(".")
        if head != package or "." in rest or mod.is_package or not rest:
            continue
        if LAB_OR_BENCH.match(rest):
            bad.append(f"{name}: a lab's or the benchmark's module at the top level")
        elif rest not in CORE:
            bad.append(f"{name}: not a core module (core: {', '.join(sorted(CORE))})")
    return bad


def layer(name: str) -> str:
    """The part of the house a module belongs to: ``"labs"``, ``"checks"``, ``"solutions"``,
    ``"instruments"``, ``"bench"``, ``"commands"``, ``"classroom"``, or ``"core"`` (the top level,
    ``pool/``, ``debugging/``)."""
    parts = name.split(".")
    if len(parts) > 2 or (len(parts) == 2 and parts[1] in PARTS):
        return parts[1] if parts[1] in PARTS else "core"
    return "core"


PARTS = ("labs", "checks", "solutions", "instruments", "bench", "commands", "classroom")
HIGH = {"labs", "checks", "solutions"}  # what a learner's notebook imports: nothing below imports it
# layer -> the layers it must not import (classroom, which releases and grades the exercises, is free)
FORBIDDEN = {"core": HIGH | {"instruments"}, "instruments": HIGH, "bench": HIGH, "commands": HIGH,
             "labs": {"checks", "solutions"}}


def upward_imports(modules: dict[str, Module]) -> list[str]:
    """Imports against the direction of the house (``FORBIDDEN``), function-level ones included."""
    bad = []
    for mod in modules.values():
        low = layer(mod.name)
        for target, _, _, line in imports(mod, modules):
            if layer(target) in FORBIDDEN.get(low, ()):
                bad.append(f"{mod.name}:{line} ({low}) imports {target} ({layer(target)})")
    return sorted(set(bad))


def private_torch_uses(modules: dict[str, Module], gateway: str) -> list[str]:
    """Private torch names (a ``_x`` part of a ``torch...`` import or attribute chain) reached outside
    the module ``gateway`` (``compat``)."""
    private = re.compile(r"^_(?!_)")

    def chain(node) -> list[str]:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else []

    bad = []
    for mod in modules.values():
        if mod.name == gateway:
            continue
        torch_names = {"torch"}  # names bound to torch or one of its modules in this module
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "torch":
                        torch_names.add((a.asname or a.name).split(".")[0])
                        if any(private.match(p) for p in a.name.split(".")):
                            bad.append(f"{mod.name}:{node.lineno} imports {a.name}")
            elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "torch":
                names = node.module.split(".") + [a.name for a in node.names]
                if any(private.match(p) for p in names):
                    bad.append(f"{mod.name}:{node.lineno} imports from {node.module}")
                torch_names |= {a.asname or a.name for a in node.names}
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.Attribute) and private.match(node.attr):
                names = chain(node)
                if names and names[0] in torch_names:
                    bad.append(f"{mod.name}:{node.lineno} uses {'.'.join(names)}")
    return sorted(set(bad))


# ----------------------------------------------------------------------------- the real package
MODULES = load(PACKAGE)


def test_no_import_cycle():
    assert not cycles(MODULES), "\n".join(" -> ".join(c) for c in cycles(MODULES))


def test_no_private_name_crosses_modules():
    assert not private_uses(MODULES), "\n".join(private_uses(MODULES))


def test_no_reexports():
    assert not reexports(MODULES), "\n".join(reexports(MODULES))


def test_top_level_is_the_core():
    assert not top_level_misfits(MODULES, "labutils"), "\n".join(top_level_misfits(MODULES, "labutils"))


def test_dependencies_run_one_way():
    assert not upward_imports(MODULES), "\n".join(upward_imports(MODULES))


def test_private_torch_names_only_through_compat():
    assert not private_torch_uses(MODULES, "labutils.compat"), "\n".join(private_torch_uses(MODULES, "labutils.compat"))


def test_layout_has_its_parts():
    names = set(MODULES)
    for part in ("labutils.bench", "labutils.commands", "labutils.labs", "labutils.checks",
                 "labutils.solutions", "labutils.pool"):
        assert part in names, f"{part} is missing"
    for verb in ("hw", "run_labs", "bench"):
        assert f"labutils.commands.{verb}" in names
        funcs = {n.name for n in MODULES[f"labutils.commands.{verb}"].tree.body if isinstance(n, ast.FunctionDef)}
        assert {"add_arguments", "run"} <= funcs, f"commands.{verb} needs add_arguments(parser) and run(args)"
    labs = [n for n in names if re.fullmatch(r"labutils\.labs\.lab\d\d_[a-z0-9_]+", n)]
    assert labs and all(MODULES[n].is_package for n in labs)


# ----------------------------------------------------------------------------- the detector itself
def _package(tmp_path: Path, files: dict[str, str]) -> dict[str, Module]:
    root = tmp_path / "pkg"
    for rel, text in {"__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return load(root)


def test_detector_finds_a_cycle_through_a_function_level_import(tmp_path):
    mods = _package(tmp_path, {"a.py": "from . import b\n",
                               "b.py": "def f():\n    from .sub.c import g\n    return g\n",
                               "sub/__init__.py": "", "sub/c.py": "import pkg.a\ndef g(): pass\n"})
    assert cycles(mods) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]
    clean = _package(tmp_path / "clean", {"a.py": "from . import b\n", "b.py": "x = 1\n"})
    assert cycles(clean) == []


def test_detector_finds_private_names_imported_or_used(tmp_path):
    mods = _package(tmp_path, {"a.py": "def _hidden(): pass\n__version__ = '1'\n",
                               "b.py": "from .a import _hidden, __version__\nprint(_hidden, __version__)\n",
                               "c.py": "from . import a\nprint(a._hidden())\n",
                               "d.py": "def _mine(): pass\nprint(_mine())\n"})
    assert private_uses(mods) == ["pkg.b:1 imports _hidden from pkg.a", "pkg.c:2 uses pkg.a._hidden"]


def test_detector_finds_reexports_but_not_in_a_package_init(tmp_path):
    mods = _package(tmp_path, {"__init__.py": "from .a import f\n",
                               "a.py": "def f(): pass\n",
                               "only.py": '"""Nothing but imports."""\nfrom .a import f\n',
                               "partly.py": "from .a import f\nimport json\ndef g(): return json\n",
                               "user.py": "from .a import f\nf()\n"})
    assert reexports(mods) == ["pkg.only:2 re-exports pkg.a.f", "pkg.partly:1 re-exports pkg.a.f"]


def test_detector_finds_lab_and_bench_modules_at_the_top(tmp_path):
    mods = _package(tmp_path, {"bench_ops.py": "", "tp_comm.py": "", "launch.py": "", "extra.py": "",
                               "labs/__init__.py": "", "labs/lab02_tp/comm.py": "",
                               "bench/__init__.py": "", "bench/ops.py": ""})
    assert top_level_misfits(mods, "pkg") == [
        "pkg.bench_ops: a lab's or the benchmark's module at the top level",
        f"pkg.extra: not a core module (core: {', '.join(sorted(CORE))})",
        "pkg.tp_comm: a lab's or the benchmark's module at the top level"]


def test_detector_finds_imports_against_the_direction(tmp_path):
    mods = _package(tmp_path, {"launch.py": "def f():\n    from .labs.lab01 import measure\n",
                               "pool/__init__.py": "", "pool/worker.py": "from ..instruments import ledger\n",
                               "instruments/__init__.py": "", "instruments/ledger.py": "from .. import launch\n",
                               "bench/__init__.py": "", "bench/run.py": "import pkg.checks.lab01\n",
                               "labs/__init__.py": "", "labs/lab01/__init__.py": "",
                               "labs/lab01/measure.py": "from ...solutions import lab01\nfrom ...instruments import ledger\n",
                               "checks/__init__.py": "", "checks/lab01.py": "from ..labs.lab01 import measure\n",
                               "solutions/__init__.py": "", "solutions/lab01.py": "x = 1\n"})
    assert upward_imports(mods) == [
        "pkg.bench.run:1 (bench) imports pkg.checks.lab01 (checks)",
        "pkg.labs.lab01.measure:1 (labs) imports pkg.solutions.lab01 (solutions)",
        "pkg.launch:2 (core) imports pkg.labs.lab01.measure (labs)",
        "pkg.pool.worker:1 (core) imports pkg.instruments.ledger (instruments)"]


def test_detector_finds_private_torch_names_outside_compat(tmp_path):
    mods = _package(tmp_path, {
        "compat.py": "import torch\nfrom torch.utils import _pytree\nx = torch._C\n",
        "a.py": "import torch\nfrom torch.utils._python_dispatch import TorchDispatchMode\ntorch.cuda._sleep(1)\n",
        "b.py": "import torch._C._distributed_c10d as c10d\n",
        "c.py": "import torch.distributed as dist\nfrom torch.utils import _pytree\ny = dist._world\n",
        "d.py": "import torch\nclass A:\n    def _own(self): pass\ntorch.cuda.synchronize()\nA()._own()\n"})
    assert private_torch_uses(mods, "pkg.compat") == [
        "pkg.a:2 imports from torch.utils._python_dispatch", "pkg.a:3 uses torch.cuda._sleep",
        "pkg.b:1 imports torch._C._distributed_c10d", "pkg.c:2 imports from torch.utils",
        "pkg.c:3 uses dist._world"]


@pytest.mark.parametrize("name", ["pipeline_bench", "p2p", "cudacomm_analysis", "copybw", "lab03", "tensor_parallel",
                                  "overlap"])
def test_prefix_rule_covers_the_old_names(name):
    assert LAB_OR_BENCH.match(name)
