"""The package's imports point down its layers, never in a circle (README: "How it works").

Read from the source with ``ast``, nothing imported: every ``import`` of a
package module, at any depth (``TYPE_CHECKING`` blocks too), is checked.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "scrapy_bloomdupe"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

#: Layer of each module, by its name below the package; a module may import
#: only modules of its own layer or lower ones.
LAYERS: dict[str, int] = {
    "": 0,  # the package's __init__: its version only
    # 1: pure logic, no I/O
    "exceptions": 1, "keys": 1, "sizing": 1, "hashing": 1, "localcache": 1, "settings": 1,
    "versions": 1,
    "luascript": 1, "redaction": 1, "redisargs": 1, "settingstable": 1, "settingvalues": 1,
    # 2: redis-py only
    "transport": 2,
    # 3: the filter and the queue (Scrapy only where a queue entry is a Scrapy Request:
    # SCRAPY_AT_RUN_TIME); the crawl's figures read from both
    "bloom": 3, "frontier": 3, "crawlstats": 3, "crawlfigures": 3,
    # 4: thin Scrapy components (and the optional prometheus-client they serve with)
    "dupefilter": 4, "scheduler": 4, "middleware": 4, "extension": 4, "addon": 4,
    "connection": 4, "fingerprint": 4, "cluster": 4, "failures": 4, "workermetrics": 4,
    "prometheus": 4, "scheduling": 4, "persistence": 4, "backoff": 4,
    # 5: tools
    "cli": 5, "commands": 5, "migrate": 5, "testing": 5,
}
#: The modules below layer 4 that import Scrapy (or scrapy-redis, which is built on it) when
#: they run, not only for type checks: a queue entry's codec (Scrapy's Request and
#: ``request_from_dict``), the queue, a scrapy-redis queue class, and the download slots'
#: policy, which reads Scrapy's default settings (the per-site limits' defaults, whether
#: this Scrapy has ``DOWNLOAD_DELAY_JITTER``). docs/architecture.md says so; the rest of
#: layers 1-3 is Scrapy-free.
SCRAPY_AT_RUN_TIME = {"scrapy_bloomdupe.frontier.entry", "scrapy_bloomdupe.frontier.queue",
                      "scrapy_bloomdupe.frontier.politeness"}
#: Sibling packages of one layer that must not know each other.
APART = [("bloom", "frontier")]
#: Within a layer, what a package sits below: the scheduler's parts (``scheduling/``) are
#: below the Scrapy components that use them, the scheduler first.
BELOW: dict[str, set[str]] = {
    "scheduling": {"scheduler", "dupefilter", "middleware", "extension", "failures", "addon",
                   "workermetrics", "prometheus", "backoff"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def top(module: str) -> str:
    """``scrapy_bloomdupe.bloom.filter`` -> ``bloom``."""
    return module.split(".")[1] if "." in module else ""


def resolve(module: str, node: ast.ImportFrom | ast.Import) -> list[str]:
    """The package modules an import statement in ``module`` names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == PACKAGE]
    if node.level:
        base = module.split(".")
        if MODULES[module].name != "__init__.py":
            base.pop()
        base = base[: len(base) - (node.level - 1)]
        target = ".".join([*base, *([node.module] if node.module else [])])
    else:
        target = node.module or ""
    if target.split(".")[0] != PACKAGE:
        return []
    # ``from . import keys`` names a module; ``from .keys import meta`` a name in one.
    named = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]
    return named or [target]


def imports(module: str) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for each package import of ``module``."""
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.extend((t, child.lineno, in_function) for t in resolve(module, child))
            visit(child, in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return found


GRAPH = {m: imports(m) for m in MODULES}


def test_every_module_has_a_layer() -> None:
    assert sorted({top(m) for m in MODULES} - set(LAYERS)) == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module: str) -> None:
    layer = LAYERS[top(module)]
    upward = [f"line {line}: {target} (layer {LAYERS[top(target)]})"
              for target, line, _ in GRAPH[module] if LAYERS[top(target)] > layer]
    assert upward == [], f"{module} (layer {layer}) imports upward"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_function_local_imports_of_the_package(module: str) -> None:
    local = [f"line {line}: {target}" for target, line, inside in GRAPH[module] if inside]
    assert local == []


@pytest.mark.parametrize(("one", "other"), APART)
def test_apart_packages_never_import_each_other(one: str, other: str) -> None:
    crossing = [f"{m} -> {t}" for m, found in GRAPH.items() for t, _, _ in found
                if {top(m), top(t)} == {one, other}]
    assert crossing == []


@pytest.mark.parametrize("lower", sorted(BELOW))
def test_a_package_never_imports_what_sits_above_it_in_its_layer(lower: str) -> None:
    upward = [f"{m} -> {t}" for m, found in GRAPH.items() if top(m) == lower
              for t, _, _ in found if top(t) in BELOW[lower]]
    assert upward == []


def test_nothing_imports_the_test_helpers() -> None:
    users = [f"{m} -> {t}" for m, found in GRAPH.items() for t, _, _ in found
             if top(t).startswith("testing") and not top(m).startswith("testing")]
    assert users == []


def _scrapy_imports_at_run_time(module: str) -> list[str]:
    """The ``scrapy``/``scrapy_redis`` imports of ``module`` outside ``if TYPE_CHECKING:``."""
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.extend(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom) and not child.level:
                found.append(child.module or "")
            visit(child)

    visit(tree)
    return [name for name in found if name.split(".")[0] in ("scrapy", "scrapy_redis")]


def test_below_the_scrapy_components_only_the_queue_entry_and_the_queue_use_scrapy() -> None:
    users = {m for m in MODULES if LAYERS[top(m)] < 4 and _scrapy_imports_at_run_time(m)}
    assert users == SCRAPY_AT_RUN_TIME


def test_no_import_cycles() -> None:
    edges = {m: {t for t, _, _ in found if t != m and t in MODULES} for m, found in GRAPH.items()}
    # A package imports its own __init__ implicitly; cycles through that do not count.
    for m in edges:
        edges[m] = {t for t in edges[m] if not m.startswith(t + ".")}
    state: dict[str, int] = {}
    path: list[str] = []
    cycles: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt):], nxt]))
            elif nxt not in state:
                walk(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            walk(node)
    assert cycles == []
