"""Settings: the defaults that follow other settings, and the combinations refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from celery_durable.config import Settings


def test_the_broker_defaults_to_the_journal_redis_and_follows_it_in_a_copy() -> None:
    settings = Settings(redis_url="redis://journal:6379/1")
    assert settings.broker_url == settings.effective_broker_url == "redis://journal:6379/1"
    moved = settings.model_copy(update={"redis_url": "redis://elsewhere:6380/0"})
    assert moved.broker_url == "redis://elsewhere:6380/0"
    assert "broker_url" not in moved.model_fields_set  # it still follows in the next copy
    assert moved.model_copy(update={"redis_url": "redis://third:1/0"}).broker_url == "redis://third:1/0"


def test_a_broker_that_was_set_stays_where_it_was_set() -> None:
    settings = Settings(redis_url="redis://journal:6379/1", broker_url="amqp://guest@rabbit:5672//")
    assert settings.model_copy(update={"redis_url": "redis://elsewhere:1/0"}).broker_url == "amqp://guest@rabbit:5672//"


def test_the_environment_sets_the_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CELERY_DURABLE_REDIS_URL", "redis://journal:6379/1")
    assert Settings().broker_url == "redis://journal:6379/1"
    monkeypatch.setenv("CELERY_DURABLE_BROKER_URL", "redis://broker:6379/2")
    assert Settings().broker_url == "redis://broker:6379/2"


def test_a_cluster_journal_needs_a_broker_of_its_own() -> None:
    with pytest.raises(ValidationError, match="redis_cluster needs broker_url"):
        Settings(redis_url="redis://node:7000/0", redis_cluster=True)
    settings = Settings(redis_url="redis://node:7000/0", redis_cluster=True, broker_url="redis://single:6379/0")
    assert settings.effective_broker_url == "redis://single:6379/0"


def test_queue_names_are_the_specs_defaults_whatever_the_key_prefix() -> None:
    """SPEC §10: defaults durable.coordinator, durable.steps, durable.agents."""
    for settings in (Settings(), Settings(key_prefix="billing")):
        assert (settings.coordinator_queue, settings.steps_queue, settings.agents_queue) == (
            "durable.coordinator", "durable.steps", "durable.agents",
        )
    assert Settings(key_prefix="billing", steps_queue="mine").steps_queue == "mine"
    with pytest.raises(ValidationError, match="must differ"):
        Settings(steps_queue="same", agents_queue="same")
