"""Test helpers shared by every folder of the suite, imported as ``helpers.<module>``.

tests/conftest.py puts tests/ on ``sys.path``, so ``from helpers.opcheck import OpCase`` works from
any test folder; ``helpers.data`` is the one place that knows where the repository, ``src/`` and
``tests/data`` are.
"""
