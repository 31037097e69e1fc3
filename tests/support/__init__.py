"""What the tests share: the poll helper and its bounds, the deployments (one
Redis, a Redis Cluster, RabbitMQ), the test apps workers load, and the
helpers several test modules use. No test module imports another one."""
