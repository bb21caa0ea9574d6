"""The library's rooms: imports run one way, as each room's README says; the design page shows the code's picture."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from classifier_engine.docs import rooms

DESIGN = rooms.PACKAGE / "docs" / "design.md"
MOST_MODULES = 16  # modules in one folder of a room (a sub-package such as data/streams/ is its own folder)


def broken_rules(package: Path) -> list[tuple[str, str, list[str]]]:
    """(room, room it imports without its README's leave, the files) for every such arrow."""
    known = rooms.rooms(package)
    return [
        (source, target, files)
        for (source, target), files in sorted(rooms.arrows(package).items())
        if target not in known[source].may_import
    ]


def test_every_room_imports_only_what_its_readme_allows_and_no_two_rooms_reach_each_other():
    known = rooms.rooms()
    found = rooms.arrows()
    assert {"cli", "checkpoints", "runs", "faults", "export", "cross_validation", "data", "models"} <= set(known)
    assert len(found) > 30  # the arrows are read (a parser that saw nothing would pass the rules)
    assert broken_rules(rooms.PACKAGE) == []
    assert rooms.cycles(set(found)) == []
    declared = {(name, other) for name, room in known.items() for other in room.may_import}
    assert rooms.cycles(declared) == []  # the rules themselves run one way
    assert all(other in known for _, other in declared), declared  # a README names only rooms that exist


def test_no_folder_of_the_library_holds_more_than_about_fifteen_modules():
    folders = {path.parent for path in rooms.PACKAGE.rglob("*.py")}
    sizes = {folder: len([p for p in folder.glob("*.py") if p.name != "__init__.py"]) for folder in folders}
    assert max(sizes.values()) <= MOST_MODULES, sizes


def test_the_design_page_shows_the_picture_the_code_draws():
    page = DESIGN.read_text(encoding="utf-8")
    shown = page.split("<!-- rooms: python -m classifier_engine.docs.rooms -->\n", 1)[1].split("\n<!-- /rooms -->")[0]
    printed = subprocess.run(
        [sys.executable, "-m", "classifier_engine.docs.rooms"], capture_output=True, text=True, check=True
    ).stdout
    assert shown == printed.rstrip("\n") == rooms.picture()
    for source, target in rooms.arrows():
        assert f"    {source} --> {target}\n" in shown + "\n"


def test_an_import_against_the_rules_is_named_and_a_loop_is_found(tmp_path):
    package = tmp_path / "classifier_engine"
    for name, allowed in (("low", "nothing"), ("high", "low")):
        (package / name).mkdir(parents=True)
        (package / name / "__init__.py").write_text("")
        (package / name / "README.md").write_text(f"# {name}: a room\n\nMay import: {allowed}.\n")
    (package / "high" / "uses.py").write_text("from ..low import parts\n")
    (package / "low" / "parts.py").write_text("def helper():\n    from classifier_engine.high.uses import x\n")
    assert broken_rules(package) == [("low", "high", ["low/parts.py"])]  # a lazy import counts too
    assert rooms.cycles(set(rooms.arrows(package))) == [("high", "low"), ("low", "high")]
    (package / "high" / "README.md").write_text("# high: no rules\n")
    with pytest.raises(ValueError, match=r"high/ has no README\.md with a 'May import:' line"):
        rooms.rooms(package)
