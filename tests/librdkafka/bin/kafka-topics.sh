#!/usr/bin/env bash
# kafka-topics.sh for librdkafka's test runner (KAFKA_PATH=tests/librdkafka): the same through
# Strata's Kafka admin APIs (kafka_shim.py, confluent-kafka's AdminClient).
here="$(cd "$(dirname "$0")/.." && pwd)"
exec "${LRK_SHIM_PYTHON:-python3}" "$here/kafka_shim.py" topics "$@"
