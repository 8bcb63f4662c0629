"""The package's structure stays legible (issue 24): every class (and type alias) name is defined
once; no module over 400 lines, the hubs under 350, no function over 80; the serving gateway and
the library never import the offline analyzer; the README names every module."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "infercache"


def _defined_names(tree: ast.Module) -> list[str]:
    """Public classes and CapWords type aliases defined at a module's top level."""
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if (
                    isinstance(target, ast.Name)
                    and target.id[:1].isupper()
                    and not target.id.isupper()
                    and isinstance(node.value, ast.Subscript | ast.BinOp | ast.Attribute)
                ):
                    names.append(target.id)
    return [n for n in names if not n.startswith("_")]


def test_no_class_or_type_name_is_defined_twice_in_the_package() -> None:
    where: dict[str, list[str]] = collections.defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in _defined_names(ast.parse(path.read_text(), filename=str(path))):
            where[name].append(str(path.relative_to(PACKAGE)))
    twice = {name: files for name, files in where.items() if len(files) > 1}
    assert twice == {}, f"names a newcomer cannot tell apart: {twice}"


def test_the_check_sees_classes_and_aliases() -> None:
    tree = ast.parse(
        "class Alpha: ...\nBeta = dict[str, int]\nGamma = 3\nMAX = list[int]\n_D = int | None"
    )
    assert _defined_names(tree) == ["Alpha", "Beta"]


# Subpackages whose every module the README's Layout table names (the others: the package).
NAMED_PACKAGES = ("gateway", "openai", "embeddings")


def test_the_readme_layout_names_every_module() -> None:
    """Every module at the package's top level and in the subpackages above appears in the
    README's Layout table, so a newcomer can find it there."""
    readme = (PACKAGE.parents[1] / "README.md").read_text(encoding="utf-8")
    layout = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    modules = [*PACKAGE.glob("*.py")]
    for package in NAMED_PACKAGES:
        modules.extend((PACKAGE / package).glob("*.py"))
    missing = sorted(
        str(p.relative_to(PACKAGE))
        for p in modules
        if p.name != "__init__.py" and f"`{p.name}`" not in layout
    )
    assert missing == [], f"modules the README's Layout table does not name: {missing}"
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    assert [name for name in packages if f"`{name}/`" not in layout] == []


def _lease_closes(tree: ast.Module) -> list[int]:
    """Lines calling `close_shared`, or `close` on a name `miss` (a replica flight's lease,
    gateway/across_replicas.py, is another thing, closed there)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name, owner = node.func.attr, node.func.value
            shared = name == "close_shared"
            leased = name == "close" and isinstance(owner, ast.Name) and owner.id == "miss"
            if shared or leased:
                lines.append(node.lineno)
    return lines


def test_a_miss_is_closed_by_the_one_miss_protocol_only() -> None:
    closing = {
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if _lease_closes(ast.parse(path.read_text(), filename=str(path)))
    }
    assert closing == {"miss_flight.py"}


def test_the_readme_layout_and_each_package_docstring_name_its_subpackages() -> None:
    """A subpackage (analyze/reports/, tokenizing/, ...) is named in the README's Layout table
    and in the docstring of the package holding it, so the wings can be found from the top."""
    readme = (PACKAGE.parents[1] / "README.md").read_text(encoding="utf-8")
    layout = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    unnamed = []
    for init in sorted(PACKAGE.rglob("*/*/__init__.py")):
        sub = init.parent
        holder = ast.get_docstring(ast.parse((sub.parent / "__init__.py").read_text())) or ""
        if f"`{sub.name}/`" not in layout or f"{sub.name}/" not in holder:
            unnamed.append(str(sub.relative_to(PACKAGE)))
    assert unnamed == [], (
        f"subpackages the README or their package's docstring do not name: {unnamed}"
    )


def _line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_is_over_400_lines_and_the_hubs_stay_under_350() -> None:
    sizes = {p.relative_to(PACKAGE).as_posix(): _line_count(p) for p in PACKAGE.rglob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 400} == {}
    assert sizes["cache.py"] < 350
    assert sizes["gateway/service.py"] < 350


def test_no_function_is_over_80_lines() -> None:
    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > 80:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.name} ({lines} lines)")
    assert long == []


def _imported_modules(tree: ast.Module) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_neither_the_gateway_nor_the_library_stands_on_the_analyzer() -> None:
    serving = [*PACKAGE.glob("*.py"), *(PACKAGE / "gateway").rglob("*.py")]
    offenders = {
        path.relative_to(PACKAGE).as_posix()
        for path in serving
        for name in _imported_modules(ast.parse(path.read_text(encoding="utf-8")))
        if name == "infercache.analyze" or name.startswith("infercache.analyze.")
    }
    # cli.py, the command line's root, registers every subcommand, `analyze` among them
    assert offenders == {"cli.py"}, offenders
