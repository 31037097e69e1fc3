"""Engines that the tests' worker processes load by import path."""

from __future__ import annotations

import redis
from redis.cluster import RedisCluster

from celery_durable import Settings


def side_redis(settings: Settings) -> redis.Redis | RedisCluster:
    """A client for an app's own keys (gates, fake providers) beside the
    journal, on the journal's Redis: a cluster-aware one when that is a
    Redis Cluster, where a plain client would be refused every key of a slot
    its node does not serve."""
    if settings.redis_cluster:
        return RedisCluster.from_url(settings.redis_url, decode_responses=True)
    return redis.Redis.from_url(settings.redis_url, decode_responses=True)
