"""Rule names live in one table (harness/rules.py): the README shows that table, and nothing raises a rule outside it."""
import re
from pathlib import Path

import pytest

from harness import rules

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_table_of_rules_is_the_rules_module():
    assert rules.markdown_table() in (ROOT / "README.md").read_text(), \
        "README.md's table of rules differs from harness/rules.py: paste rules.markdown_table() into it"


def test_every_rule_the_harness_names_is_in_the_table():
    named = set()
    for path in (ROOT / "harness").glob("*.py"):
        named |= set(re.findall(r'Failure\("([a-z-]+)"', path.read_text()))
        named |= set(re.findall(r'Verdict\((?:False|True), "([a-z-]+)"', path.read_text()))
    assert named and named <= rules.ALL | rules.NOT_RUN, sorted(named - rules.ALL - rules.NOT_RUN)


def test_an_unknown_rule_is_a_harness_bug_caught_where_it_is_raised():
    with pytest.raises(ValueError, match="unknown rule"):
        rules.Failure("wrong-outptu", "typo")
    assert rules.Failure("wrong-output", "x").rule == "wrong-output"
