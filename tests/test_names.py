"""Plain names (workflow names, namespaces, key prefixes): one rule, whole text only."""

from __future__ import annotations

import pytest

from celery_durable.names import NAMESPACE_PATTERN, WORKFLOW_NAME_PATTERN, name_pattern, name_rule


@pytest.mark.parametrize("text", ["a", "default", "Team.A_b-9", "x" * 64])
def test_a_namespace_is_a_short_plain_name(text: str) -> None:
    assert NAMESPACE_PATTERN.match(text)


@pytest.mark.parametrize("text", ["", "x" * 65, "a b", "a:b", "naïve", "ns\n", "\nns", "a{b}"], ids=repr)
def test_anything_else_is_refused_whichever_match_a_caller_uses(text: str) -> None:
    # A pattern anchored with $ would let "ns\n" through .match(): \A...\Z does not.
    for method in (NAMESPACE_PATTERN.match, NAMESPACE_PATTERN.search, NAMESPACE_PATTERN.fullmatch):
        assert method(text) is None


def test_workflow_names_are_longer_and_the_rule_reads_as_the_pattern_checks() -> None:
    assert WORKFLOW_NAME_PATTERN.match("x" * 128) and not WORKFLOW_NAME_PATTERN.match("x" * 129)
    assert name_pattern(3).match("abc") and not name_pattern(3).match("abcd")
    assert name_rule(64) == "1-64 characters of [A-Za-z0-9._-]"
