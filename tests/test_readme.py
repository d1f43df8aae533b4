"""The README's Python examples run as written (their own asserts check the results)."""

import re

import pytest

from helpers.data import ROOT

README = ROOT / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("i", range(len(BLOCKS)))
def test_readme_example_runs(i, capsys):
    exec(compile(BLOCKS[i], f"README.md[block {i}]", "exec"), {})
    assert capsys.readouterr().out.strip()
