"""The display name a branch task takes in Flower once it has run (``tasks/flower_names.py``)."""

from __future__ import annotations

from celery_durable.tasks.flower_names import display_name


def test_a_task_that_ran_one_step_is_named_after_it() -> None:
    assert display_name("order", ["charge-card"]) == "order · step charge-card"
    assert display_name("order", ["charge-card", "charge-card"]) == "order · step charge-card"  # a retry, once


def test_a_few_steps_are_listed_and_many_are_the_first_and_a_count() -> None:
    assert display_name("order", ["a", "b", "c"]) == "order · steps a, b, c"
    assert display_name("order", [f"fetch-{i}" for i in range(12)]) == "order · steps fetch-0 +11"
    long = ["x" * 50, "y" * 50, "z" * 50]
    assert display_name("order", long) == f"order · steps {'x' * 50} +2"


def test_a_task_that_ran_no_step_keeps_its_name() -> None:
    assert display_name("order", []) is None


def test_the_readmes_flower_names_are_the_names_flower_shows() -> None:
    """Every ``order · …`` the README shows is a name the code gives a task:
    a message's own (coordinator, agent turn, branches before they ran) or
    the one a branch task takes once it has run (``display_name``)."""
    import re

    from celery_durable import Settings
    from celery_durable.tasks.sending import agent_message, branch_messages, coordinator_message
    from tests.support.readme import README

    settings = Settings(redis_url="redis://x:6379/0")
    run = "0" * 32
    sent = {
        coordinator_message(settings, run, 1, "order").shadow,
        agent_message(settings, run, 1, "order", "a1", "m").shadow,
        *(m.shadow for m in branch_messages(settings, run, 1, "order", "m:2", [0, 1, 2], ["t1"])),
        *(m.shadow for m in branch_messages(settings, run, 1, "order", "m:2", [0], ["t1"])),
    }
    text = README.read_text(encoding="utf-8")
    shown = set(re.findall(r"`(order · [^`]+)`", " ".join(text.split())))
    assert len(shown) >= 7, shown
    flower = " ".join(text.split("In Flower, a run's tasks show", 1)[1].split("## ", 1)[0].split())
    assert "small fan-out" in flower and "never appear in Flower" in flower, "where Flower is described"
    for name in shown:
        listed = re.fullmatch(r"order · steps? (.+)", name)
        if listed is None:
            assert name in sent, name
            continue
        more = re.fullmatch(r"(\S+) \+(\d+)", listed[1])
        if more:  # the first key and how many others: fetch-0 +11 is fetch-0 … fetch-11
            stem = more[1].rpartition("-")[0]
            keys = [more[1], *(f"{stem}-{i}" for i in range(1, int(more[2]) + 1))]
        else:
            keys = listed[1].split(", ")
        assert display_name("order", keys) == name, (name, display_name("order", keys))
