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


def test_ci_runs_the_readme_test_command():
    """.ci/run is the README's test command, word for word: CI measures what a reader runs, and a test
    flag (--durations, markers) added to one is added to both."""
    command = re.search(r"Run the tests[^\n]*\n\n```sh\n(.*?)\n```", README.read_text(), flags=re.S).group(1)
    assert "python -m pytest" in command
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert command in ci
