"""gguf.context.Catalog: the records-with-a-name-index behind a GGUF file's metadata and tensor table."""

from __future__ import annotations

import pytest

from pyggml.gguf.catalog import Catalog
from pyggml.gguf.errors import GGUFKeyError


def _catalog(*names: str) -> Catalog[tuple[str, int]]:
    c: Catalog = Catalog(lambda r: r[0], "thing", lambda n: GGUFKeyError(f"no thing {n!r}"))
    for i, n in enumerate(names):
        c.append((n, i))
    return c


def test_ids_follow_positions_and_names_find_them() -> None:
    c = _catalog("a", "b", "c")
    assert len(c) == 3 and [r[0] for r in c] == ["a", "b", "c"]
    assert c.find("b") == 1 and c.find("z") == -1 and "c" in c and "z" not in c
    assert c.get("c") == ("c", 2) and c.get(0) == ("a", 0) and c[-1] == ("c", 2)


def test_lookups_that_miss_raise_naming_the_problem() -> None:
    c = _catalog("a")
    with pytest.raises(GGUFKeyError, match="no thing 'b'"):
        c.get("b")
    with pytest.raises(GGUFKeyError, match=r"thing id 1 out of range \[0, 1\)"):
        c.get(1)


def test_remove_moves_later_records_up_and_keeps_the_index() -> None:
    c = _catalog("a", "b", "c")
    assert c.remove("a") == 0 and c.remove("a") == -1
    assert c.find("b") == 0 and c.find("c") == 1 and c.get(1) == ("c", 2)


def test_replacing_a_record_keeps_its_name() -> None:
    c = _catalog("a", "b")
    c[1] = ("b", 9)
    assert c.get("b") == ("b", 9)
    with pytest.raises(ValueError, match="thing 1 is 'b', not 'x'"):
        c[1] = ("x", 0)
