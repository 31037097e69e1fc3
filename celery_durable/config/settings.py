"""One settings object for every component (env prefix ``CELERY_DURABLE_``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from celery_durable.names import NAMESPACE_MAX, NAMESPACE_PATTERN, name_rule

REDIS_SCHEMES = ("redis", "rediss", "unix")
DEFAULT_KEY_PREFIX = "cd"


class Settings(BaseSettings):
    """Where the journal lives, how Celery is routed, and the engine's ceilings.

    Workers and clients read the same environment, so they agree on queues,
    key prefix and agent runner without code changes.
    """

    model_config = SettingsConfigDict(env_prefix="CELERY_DURABLE_", extra="forbid", validate_default=True)

    redis_url: str = Field(default="redis://localhost:6379/0", description="The journal store.")
    broker_url: str | None = Field(default=None, description="Celery broker; defaults to redis_url.")
    redis_cluster: bool = Field(
        default=False,
        description=(
            "The journal is a Redis Cluster and redis_url names any of its nodes. The broker cannot be one "
            "(kombu has no Redis Cluster transport): broker_url must then name a single Redis or a RabbitMQ."
        ),
    )
    namespace: str = Field(default="default", description="The namespace a client uses when none is given.")
    key_prefix: str = Field(default=DEFAULT_KEY_PREFIX, description="Prefix of every Redis key celery-durable writes.")
    coordinator_queue: str = "durable.coordinator"
    steps_queue: str = "durable.steps"
    agents_queue: str = "durable.agents"
    lease_seconds: float = Field(default=30.0, gt=0, le=86_400)
    redis_timeout_seconds: float = Field(
        default=5.0,
        gt=0,
        le=300,
        description=(
            "Longest wait for one Redis operation; past it the call fails with StorageUnavailableError. Keep it "
            "below lease_seconds, so a stalled Redis is noticed while leases can still be defended."
        ),
    )
    auto_recover: bool = True
    max_recoveries: int = Field(
        default=20,
        ge=1,
        le=1_000_000,
        description=(
            "Take-overs (or redeliveries of a message whose worker died) in a row, with nothing new journaled between "
            "them, after which a run whose passes die every time ends error, reason recovery_limit, resumable, "
            "instead of being taken over for ever."
        ),
    )
    unserved_backoff_seconds: float = Field(
        default=30.0,
        ge=0.5,
        le=3600,
        description=(
            "The longest a message of a run whose workflow this worker does not register waits, passed back to "
            "its queue, before a worker takes it again: the wait starts at half a second and doubles with each "
            "pass up to this, so workers that cannot serve a run never spin on it, and one that can finds it "
            "within about this long once it is up."
        ),
    )
    max_fanout: int = Field(default=4096, ge=1, le=1_000_000)
    fanout_tasks: int = Field(
        default=64,
        ge=1,
        le=100_000,
        description=(
            "Most branch tasks one fan-out is split into, so most worker slots it uses at once; wider fan-outs "
            "give each task several branches. Each task replays the body up to the fan-out: 64 against 256 "
            "halved the time of a 4,096 fan-out (benchmarks/NOTES.md). Raise it for a fleet of more step slots."
        ),
    )
    parked_executions: int = Field(
        default=64,
        ge=0,
        le=100_000,
        description=(
            "Main bodies a worker process keeps parked (a thread each, no worker slot) at a ctx.call, so the "
            "pass its answer starts goes on from the call instead of replaying the run: sequential calls then "
            "cost the same each, not more with every call before them; and as many fan-outs whose thunks it "
            "keeps, so a branch woken by its call or agent turn runs without replaying the body. Each is kept "
            "at most lease_seconds; 0 replays every pass."
        ),
    )
    home_queues: bool = Field(
        default=True,
        description=(
            "Each threads (or solo, gevent, eventlet) worker that consumes the coordinator queue also consumes "
            "its own home queue, <coordinator_queue>.<node name>, and a call's answer journaled by another "
            "process sends the wake of a body kept parked at that call there, instead of replaying the run where "
            "the answer landed: calls in a row then cost the same each on a fleet of several processes. A wake "
            "not started at home within 2 s (the worker stopped, died or is busy) goes to the coordinator queue. "
            "The home travels in a message header that workers of earlier versions ignore, so an upgrade needs "
            "no change to it."
        ),
    )
    branch_batch_ms: int = Field(
        default=20,
        ge=0,
        le=60_000,
        description=(
            "A branch task runs the branches it holds one after another, and hands those not begun on to the "
            "fleet as new tasks once one has run this long: quick branches share a task and one replay of the "
            "body, slow ones still spread within this delay. A fan-out starts as one task per fanout_tasks "
            "branches (at most fanout_tasks tasks); one that would start as a single task runs in the "
            "coordinator's pass that dispatched it, which hands branches on the same way. "
            "0: every branch is its own task from the start, up to fanout_tasks tasks."
        ),
    )
    max_payload_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        le=256 * 1024 * 1024,
        description="Largest args, step result, agent result, run result or log line, in UTF-8 bytes of JSON.",
    )
    progress_max_records: int = Field(
        default=10_000,
        ge=0,
        le=100_000_000,
        description="Progress records kept per run; older ones are trimmed as new ones arrive (0: keep all).",
    )
    run_retention_seconds: int = Field(
        default=7 * 86_400,
        ge=0,
        le=10 * 365 * 86_400,
        description="How long a run is kept once it is completed, cancelled, error or halted (0: forever).",
    )
    visibility_timeout_seconds: int = Field(
        default=6 * 3600,
        ge=60,
        description="Redis-broker redelivery delay; keep it above the longest step.",
    )
    agent_runner: str | None = Field(default=None, description="Import path 'package.module:attribute'.")
    openai_base_url: str | None = Field(
        default=None, description="OpenAI-compatible endpoint for OpenAIChatRunner; None means api.openai.com."
    )
    openai_api_key: SecretStr | None = Field(
        default=None, description="Key for OpenAIChatRunner; None falls back to OPENAI_API_KEY."
    )
    openai_model: str | None = Field(default=None, description="Model used when ctx.agent names none.")
    agent_timeout_seconds: float = Field(default=120, gt=0, le=86_400, description="Per agent request.")
    agent_max_retries: int = Field(default=3, ge=0, le=20, description="Retries on 429, 5xx and connection errors.")
    agent_prices: dict[str, tuple[float, float]] = Field(
        default_factory=dict,
        description="Credits per 1k prompt and completion tokens, per model; from env as JSON.",
    )
    workflows: list[str] = Field(
        default_factory=list,
        description="Modules to import: every workflow at their top level is registered, beside the engine's own.",
    )

    @field_validator("namespace", "key_prefix")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        if not NAMESPACE_PATTERN.match(value):
            raise ValueError(f"must be {name_rule(NAMESPACE_MAX)}")
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str) -> str:
        scheme = urlsplit(value).scheme
        if scheme not in REDIS_SCHEMES:
            raise ValueError(f"must be a {', '.join(s + '://' for s in REDIS_SCHEMES)} URL, got scheme {scheme!r}")
        return value

    @field_validator("agent_prices")
    @classmethod
    def _prices_finite(cls, value: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
        for model, pair in value.items():
            if not all(math.isfinite(price) and price >= 0 for price in pair):
                raise ValueError(f"prices of {model!r} must be finite and not negative")
        return value

    @model_validator(mode="after")
    def _queues_distinct(self) -> Settings:
        queues = {self.coordinator_queue, self.steps_queue, self.agents_queue}
        if len(queues) != 3:
            raise ValueError("coordinator_queue, steps_queue and agents_queue must differ")
        if self.redis_cluster and not self.broker_url:
            # Celery would otherwise use a cluster node as its broker: kombu
            # speaks to one Redis, and a node refuses every key of a slot it
            # does not serve.
            raise ValueError(
                "redis_cluster needs broker_url: kombu has no Redis Cluster transport, "
                "so the broker must be a single Redis or a RabbitMQ"
            )
        if self.broker_url is None:
            object.__setattr__(self, "broker_url", self.redis_url)
        return self

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Settings:
        """A copy with ``update``; a broker that defaulted to ``redis_url``
        follows a new ``redis_url`` (validators do not run on a copy)."""
        follows = "broker_url" not in self.model_fields_set
        if update and "redis_url" in update and "broker_url" not in update and follows:
            update = {**update, "broker_url": update["redis_url"]}
            copied = super().model_copy(update=update, deep=deep)
            copied.model_fields_set.discard("broker_url")
            return copied
        return super().model_copy(update=update, deep=deep)

    @property
    def effective_broker_url(self) -> str:
        """The broker Celery uses: ``broker_url`` (a copy may have cleared it)."""
        return self.broker_url or self.redis_url
