"""kcat (Debian's, librdkafka 2.0.x) against a real strata process."""

import os
import re
import subprocess

import pytest

from conftest import (
    N_RECORDS,
    check_partitions,
    kcat_bin,
    parse_value,
    record_key,
    record_value,
)

PARTITIONS = 6
TIMEOUT_S = 45

# Set e.g. STRATA_TEST_RDKAFKA_DEBUG=protocol,broker,msg,fetch to see librdkafka's view.
RDKAFKA_DEBUG = os.environ.get("STRATA_TEST_RDKAFKA_DEBUG")


def kcat(broker, *args, input_path=None, timeout=TIMEOUT_S):
    cmd = [kcat_bin(), "-b", broker.bootstrap, *args]
    if RDKAFKA_DEBUG:
        cmd += ["-d", RDKAFKA_DEBUG]
    stdin = open(input_path, "rb") if input_path else subprocess.DEVNULL
    try:
        res = subprocess.run(cmd, stdin=stdin, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(
            f"{' '.join(cmd)} did not finish within {timeout}s\nstderr tail:\n"
            f"{(e.stderr or b'').decode(errors='replace')[-3000:]}\n" + broker.stderr_tail()
        )
    finally:
        if input_path:
            stdin.close()
    return res


def test_kcat_produce_consume_100k(broker, tmp_path):
    topic = "kcat-100k"
    broker.create_topic(topic, PARTITIONS)

    input_path = tmp_path / "input.txt"
    with open(input_path, "w") as f:
        for i in range(N_RECORDS):
            f.write(f"{record_key(i)}:{record_value(i)}\n")

    res = kcat(broker, "-P", "-t", topic, "-K", ":", "-X", "acks=all", "-X", "linger.ms=5", "-l", str(input_path))
    err = res.stderr.decode(errors="replace")
    assert res.returncode == 0, f"kcat -P exited {res.returncode}:\n{err[-3000:]}\n" + broker.stderr_tail()
    assert "Delivery failed" not in err and "ERROR" not in err, err[-3000:]

    res = kcat(
        broker,
        "-C",
        "-t",
        topic,
        "-o",
        "beginning",
        "-e",
        "-q",
        "-f",
        "%p %o %k %s\n",
    )
    err = res.stderr.decode(errors="replace")
    assert res.returncode == 0, f"kcat -C exited {res.returncode}:\n{err[-3000:]}\n" + broker.stderr_tail()
    per_partition = {}
    for line in res.stdout.decode().splitlines():
        p, off, key, value = line.split(" ")
        per_partition.setdefault(int(p), []).append((int(off), key, parse_value(value)))
    check_partitions(per_partition, N_RECORDS, PARTITIONS)
    assert sorted(per_partition) == list(range(PARTITIONS))


def test_kcat_metadata_lists_topics(broker):
    broker.create_topic("kcat-meta-a", 6)
    broker.create_topic("kcat-meta-b", 1)
    broker.create_topic("kcat-meta-c", 3, {"retention.ms": 86400000})
    res = kcat(broker, "-L", timeout=20)
    out = res.stdout.decode()
    assert res.returncode == 0, res.stderr.decode(errors="replace")
    topics = dict(
        (name, int(n)) for name, n in re.findall(r'topic "([^"]+)" with (\d+) partitions', out)
    )
    assert topics.get("kcat-meta-a") == 6, out
    assert topics.get("kcat-meta-b") == 1, out
    assert topics.get("kcat-meta-c") == 3, out
    assert re.search(r"1 brokers:\s*\n\s*broker \d+ at 127\.0\.0\.1:%d" % broker.port, out), out
    # Every partition has a leader and no error.
    assert "Broker:" not in out, out
    assert len(re.findall(r"partition \d+, leader \d+", out)) == 10, out

    # -L for one topic, and for a missing one.
    res = kcat(broker, "-L", "-t", "kcat-meta-a", timeout=20)
    assert 'topic "kcat-meta-a" with 6 partitions' in res.stdout.decode(), res.stdout.decode()
    res = kcat(broker, "-L", "-t", "kcat-missing", timeout=20)
    out = res.stdout.decode() + res.stderr.decode(errors="replace")
    assert "kcat-missing" in out and re.search(r"(?i)unknown topic", out), out
