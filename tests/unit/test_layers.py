"""The layers of the code, and a check that imports only point down them.

Python runs an import cycle without complaint, so this test refuses what Go's compiler would: it
reads every product module's imports (module level, inside functions and under TYPE_CHECKING
alike, since each is a dependency all the same) and fails on

* any import cycle among product modules;
* any import of a module in a higher layer, or of a sibling the layer declares independent;
* a product module that no layer names (a new module must be given its place);
* boto3/botocore imported outside store.py, pyfuse3 outside the FUSE transports.

`LAYERS` is the one declaration; docs/architecture.md shows the same list (checked below).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIRS = {"ckptfs": ROOT / "gateway", "ckptfs.cli": ROOT / "cli"}

# Top to bottom. A module may import modules of its own layer and of any layer below it. Within a
# layer, " | " separates siblings that must not import each other. A name is a module or a package
# (every module under it), relative to `ckptfs`; a module belongs to the longest name that covers it.
LAYERS = [
    "cli | integrations",
    "api",
    "client",
    "daemon",
    "preflight | control",
    "fuse.kernel | fuse.libfuse | replication",
    "fs | lifecycle | fuse.handlers | fuse.workers | warmup",
    "drain | fetch | remote | peers | xattrs",
    "drainfence",
    "namespace",
    "publishing",
    "journal | cache | store | upload",
    "config | threads | dbconnection | metrics | ui | policy | storeapi | fuse.messages | fuse.iomode | fuse.mount | fuse.session | fuse.invalidations",
    "encryption | patterns | storageclass | version | sizes | fuse.ops | fuse.abi | objects | bodies | httpserver | supervisor | peering | hooks",
]
# the package markers themselves (ckptfs/fuse/__init__.py, ...) hold no code that imports; ckptfs/__init__.py
# re-exports the Python API (`api`), checked to stay cheap by tests/unit/test_api.py
MARKERS = {"", "fuse", "lifecycle", "replication", "namespace", "cli", "peers"}

# third-party packages only some modules may import, and which
CONFINED = {
    "boto3": ("store",),
    "botocore": ("store",),
    "etcd3gw": ("store",),
    "pyfuse3": ("fuse",),
}


def product_modules() -> dict[str, Path]:
    """ckptfs-relative module name ("" for the package) -> file."""
    out: dict[str, Path] = {}
    for pkg, base in PACKAGE_DIRS.items():
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([pkg, *parts])
            out[name.removeprefix("ckptfs").lstrip(".")] = path
    return out


def imports(modules: dict[str, Path]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(product module -> product modules it imports, product module -> top-level third-party packages it imports)."""

    def owner(name: str) -> str | None:
        while name not in modules:
            if "." not in name:
                return None
            name = name.rsplit(".", 1)[0]
        return name

    inner: dict[str, set[str]] = {m: set() for m in modules}
    outer: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        full = ("ckptfs." + mod).rstrip(".")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = full.split(".") if is_pkg else full.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    parent = ".".join(base + ([node.module] if node.module else []))
                else:
                    parent = node.module or ""
                names = [f"{parent}.{a.name}" for a in node.names]  # `from pkg import module` imports the module
            for name in names:
                if name == "ckptfs" or name.startswith("ckptfs."):
                    target = owner(name.removeprefix("ckptfs").lstrip("."))
                    if target is not None and target != mod:
                        inner[mod].add(target)
                else:
                    outer[mod].add(name.split(".")[0])
    return inner, outer


def layer_of(module: str) -> tuple[int, str] | None:
    """(layer index, sibling name) of a module: the longest declared name covering it."""
    best: tuple[int, str] | None = None
    for i, layer in enumerate(LAYERS):
        for sibling in (s.strip() for s in layer.split("|")):
            if module == sibling or module.startswith(sibling + "."):
                if best is None or len(sibling) > len(best[1]):
                    best = (i, sibling)
    return best


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
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
                if len(component) > 1:
                    found.append(sorted(component))
    return found


MODULES = product_modules()
INNER, OUTER = imports(MODULES)


def test_no_import_cycles() -> None:
    found = cycles(INNER)
    assert not found, "import cycles among product modules (break each by moving the shared name below both):\n" + "\n".join(
        " <-> ".join("ckptfs." + m for m in c) for c in found)


def test_every_module_has_a_layer() -> None:
    missing = sorted(m for m in MODULES if m not in MARKERS and layer_of(m) is None)
    assert not missing, f"modules no layer names: {missing}: add each to LAYERS (tests/unit/test_layers.py) and docs/architecture.md"


def test_imports_point_down_the_layers() -> None:
    wrong = []
    for mod, targets in sorted(INNER.items()):
        here = layer_of(mod)
        if here is None:
            continue
        for target in sorted(targets):
            there = layer_of(target)
            if there is None:
                continue  # a package marker
            if there[0] < here[0]:
                wrong.append(f"ckptfs.{mod} ({LAYERS[here[0]]}) imports ckptfs.{target}, a layer above it ({LAYERS[there[0]]})")
            elif there[0] == here[0] and there[1] != here[1]:
                wrong.append(f"ckptfs.{mod} imports ckptfs.{target}: {here[1]} and {there[1]} are independent siblings")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("package", sorted(CONFINED))
def test_third_party_packages_stay_in_their_module(package: str) -> None:
    allowed = CONFINED[package]
    users = sorted(m for m, pkgs in OUTER.items() if package in pkgs and not any(m == a or m.startswith(a + ".") for a in allowed))
    assert not users, f"{package} is imported by {users}; only {allowed} may"


def test_the_checker_sees_a_cycle_and_an_upward_import() -> None:
    """The checks above would pass on any graph if these helpers found nothing."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer_of("lifecycle.coldmove") == (LAYERS.index("fs | lifecycle | fuse.handlers | fuse.workers | warmup"), "lifecycle")
    assert layer_of("fuse.ops")[0] > layer_of("fuse.kernel")[0]  # type: ignore[index]
    assert any("daemon" in INNER[m] for m in INNER if m.startswith("cli")), "the graph misses imports"


def test_architecture_page_shows_the_layers() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = "\n".join(LAYERS)
    assert f"```\n{block}\n```" in text, f"docs/architecture.md must show the layers exactly as LAYERS declares them:\n{block}"


MODULE_LINES_MAX = 700
CLASS_LINES_MAX = 450


def test_modules_and_classes_stay_small() -> None:
    """A module past 700 lines or a class past 450 holds more than one concern: split it by concern."""
    big = []
    for mod, path in sorted(MODULES.items()):
        text = path.read_text()
        lines = text.count("\n")
        if lines > MODULE_LINES_MAX:
            big.append(f"{path.relative_to(ROOT)}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None and node.end_lineno - node.lineno + 1 > CLASS_LINES_MAX:
                big.append(f"{path.relative_to(ROOT)}: class {node.name} {node.end_lineno - node.lineno + 1} lines")
    assert not big, "\n".join(big)
