"""The library's rooms and the arrows between them, read from the code: ``python -m classifier_engine.docs.rooms``.

A room is a package directly under ``classifier_engine`` with a ``README.md`` that says what it owns and,
on a line ``May import: a, b`` (or ``nothing``), which rooms its modules may import. The arrows are read
from every ``import`` of the source, lazy ones included. ``docs/design.md`` shows the picture this prints;
the library's tests fail when a room imports one its README does not name, when two rooms reach each
other, or when the picture in the page is not the one the code draws.
"""

from __future__ import annotations

import argparse
import ast
import re
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
# The modules at the package's top belong to the room whose work they do.
TOP_LEVEL = {"contract": "models", "torchrun": "cli"}
MAY_IMPORT = re.compile(r"^May import: (.+?)\.?$", re.MULTILINE)


@dataclass(frozen=True)
class Room:
    """A package of the library: what its README says it owns, which rooms it may import, its modules."""

    name: str
    title: str
    may_import: frozenset[str]
    modules: tuple[str, ...]


def rooms(package: Path = PACKAGE) -> dict[str, Room]:
    """Every room, from its folder and README; a package without a README's ``May import:`` line is refused."""
    found = {}
    for folder in sorted(path.parent for path in package.glob("*/__init__.py")):
        readme = folder / "README.md"
        text = readme.read_text(encoding="utf-8") if readme.is_file() else ""
        allowed = MAY_IMPORT.search(text)
        if allowed is None:
            raise ValueError(f"{folder.name}/ has no README.md with a 'May import:' line")
        names = {name.strip() for name in allowed.group(1).split(",")} - {"nothing"}
        title = text.splitlines()[0].lstrip("# ").strip()
        modules = tuple(sorted(str(p.relative_to(package)) for p in folder.rglob("*.py") if p.name != "__init__.py"))
        found[folder.name] = Room(folder.name, title, frozenset(names), modules)
    return found


def room_of(relative: Path) -> str | None:
    """The room of a source file (``data/folder.py`` -> ``data``); ``None`` for the package's ``__init__``."""
    if len(relative.parts) > 1:
        return relative.parts[0]
    return TOP_LEVEL.get(relative.stem)


def imported_modules(path: Path, package: Path = PACKAGE) -> set[tuple[str, ...]]:
    """The ``classifier_engine`` modules a file imports, as dotted parts below the package."""
    relative = path.relative_to(package)
    own = [*relative.parent.parts] if path.name == "__init__.py" else [*relative.with_suffix("").parts][:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = own[: len(own) - node.level + 1] if node.level > 1 else own
            target = [*base, *(node.module.split(".") if node.module else [])]
            found.update((*target, alias.name) if not node.module else tuple(target) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == package.name:
            found.add(tuple(node.module.split(".")[1:]))
        elif isinstance(node, ast.Import):
            found.update(tuple(a.name.split(".")[1:]) for a in node.names if a.name.split(".")[0] == package.name)
    return {parts for parts in found if parts}


def arrows(package: Path = PACKAGE) -> dict[tuple[str, str], list[str]]:
    """(room, room it imports) -> the files that import it."""
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        source = room_of(relative)
        for parts in imported_modules(path, package):
            target = TOP_LEVEL.get(parts[0], parts[0]) if len(parts) == 1 else parts[0]
            if source is not None and target != source and (package / target).is_dir():
                found.setdefault((source, target), []).append(str(relative))
    return found


def cycles(edges: set[tuple[str, str]]) -> list[tuple[str, str]]:
    """The arrows that lie on a loop (a room that reaches itself through them)."""

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            room = todo.pop()
            if room == goal:
                return True
            if room not in seen:
                seen.add(room)
                todo.extend(b for a, b in edges if a == room)
        return False

    return sorted((a, b) for a, b in edges if reaches(b, a))


def floors(package: Path = PACKAGE) -> dict[str, int]:
    """Each room's floors: the longest chain of its own modules importing one another (1: none imports another)."""
    graph: dict[str, set[str]] = {}
    rooms_of: dict[str, str | None] = {}
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        name = ".".join(relative.with_suffix("").parts).removesuffix(".__init__")
        rooms_of[name] = room_of(relative)
        graph[name] = set()
        for parts in imported_modules(path, package):
            for length in (len(parts), len(parts) - 1):  # a module, or a name of one
                target = ".".join(parts[:length])
                if target != name and (package / Path(*parts[:length])).with_suffix(".py").is_file():
                    graph[name].add(target)
                    break
    depth: dict[str, int] = {}

    def height(name: str, trail: frozenset[str]) -> int:
        if name not in depth:
            inside = [t for t in graph.get(name, ()) if rooms_of.get(t) == rooms_of[name] and t not in trail]
            depth[name] = 1 + max((height(t, trail | {t}) for t in inside), default=0)
        return depth[name]

    result: dict[str, int] = {}
    for name in graph:
        if rooms_of[name] is not None:
            result[rooms_of[name]] = max(result.get(rooms_of[name], 0), height(name, frozenset({name})))
    return result


def picture(package: Path = PACKAGE) -> str:
    """The rooms and the arrows between them as a Mermaid flowchart (GitHub draws it), lowest room last."""
    known = rooms(package)
    edges = sorted(arrows(package))
    lines = ["```mermaid", "flowchart TD"]
    lines += [f'    {name}["{name}/ ({len(room.modules)} modules)"]' for name, room in known.items()]
    lines += [f"    {a} --> {b}" for a, b in edges]
    lines.append("```")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m classifier_engine.docs.rooms", description=__doc__.split("\n")[0])
    parser.add_argument("--table", action="store_true", help="print each room's modules, floors and rules instead")
    if parser.parse_args().table:
        levels = floors()
        for name, room in rooms().items():
            allowed = ", ".join(sorted(room.may_import)) or "nothing"
            print(f"{name:<17} {len(room.modules):>3} modules {levels.get(name, 0)} floors  may import: {allowed}")
        return
    print(picture())


if __name__ == "__main__":
    main()
