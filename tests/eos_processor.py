"""An exactly-once consume-transform-produce processor as its own process, for
tests/test_transactions.py (so that a test can SIGKILL the producer, not only brokers).

    eos_processor.py BOOTSTRAP TXN_ID GROUP IN OUT PROGRESS [--idle SECONDS] [--pause SECONDS]

A read_committed consumer in GROUP reads IN; each transaction writes up to 20 records
upper-cased to the same partition of OUT and commits the consumer's positions with them
(AddOffsetsToTxn, TxnOffsetCommit). A transaction that fails abortably is aborted and the
consumer rewound to its committed offsets, so nothing is skipped and nothing written twice
is ever committed. After each commit the running count of committed input records is
appended to PROGRESS (`C <count>`), so the test knows how far the processor got. `--pause`
holds each transaction open before its commit, its records flushed (`O <count>` then), for
kills to land mid-transaction. The
process exits 0 once IN has been idle for `--idle` seconds, 3 on a fatal error.
"""

import argparse
import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition


def main():
    ap = argparse.ArgumentParser()
    for a in ("bootstrap", "txn_id", "group", "inp", "out", "progress"):
        ap.add_argument(a)
    ap.add_argument("--idle", type=float, default=20.0)
    ap.add_argument("--pause", type=float, default=0.0)
    args = ap.parse_args()
    progress = open(args.progress, "a", buffering=1)

    c = Consumer({"bootstrap.servers": args.bootstrap, "group.id": args.group,
                  "enable.auto.commit": False, "auto.offset.reset": "earliest",
                  "isolation.level": "read_committed", "session.timeout.ms": 6000})
    c.subscribe([args.inp])
    p = Producer({"bootstrap.servers": args.bootstrap, "transactional.id": args.txn_id,
                  "transaction.timeout.ms": 60000, "linger.ms": 2})
    p.init_transactions(60)

    def rewind():
        for tp in c.committed(c.assignment(), timeout=30):
            c.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else 0))

    done, idle_since = 0, time.monotonic()
    while time.monotonic() - idle_since < args.idle:
        msgs = [m for m in c.consume(20, timeout=1) if not m.error()]
        if not msgs:
            continue
        idle_since = time.monotonic()
        try:
            p.begin_transaction()
            for m in msgs:
                p.produce(args.out, value=m.value().upper(), partition=m.partition())
            p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), 60)
            if args.pause:
                p.flush(60)
                progress.write(f"O {done}\n")  # flushed, open for `pause` seconds
                time.sleep(args.pause)
            for _ in range(10):
                try:
                    p.commit_transaction(60)
                    break
                except KafkaException as e:
                    if not e.args[0].retriable():  # (retriable: call commit again)
                        raise
            else:
                raise KafkaException("the commit kept failing")
        except KafkaException as e:
            err = e.args[0]
            if hasattr(err, "fatal") and err.fatal():
                print(f"fatal: {err}", file=sys.stderr)
                sys.exit(3)
            print(f"aborting: {err}", file=sys.stderr)
            p.abort_transaction(60)
            rewind()
            continue
        done += len(msgs)
        progress.write(f"C {done}\n")
    c.close()


if __name__ == "__main__":
    main()
