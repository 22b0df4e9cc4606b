"""One consumer group member as its own process, for tests/test_groups.py.

    group_member.py LIB BOOTSTRAP GROUP TOPIC OUT [--assignor NAME] [--delay SECONDS]
                    [--protocol classic|consumer]

LIB is `confluent` (librdkafka) or `kafka-python`. Every record consumed is written to OUT
as `R <partition> <offset> <value>` and flushed before its offset is committed (synchronously,
after each poll), so the file is what the member processed and the commits never run ahead
of it: at-least-once. Every new assignment is written as `A <unix time> <p,p,...>`. With
`--protocol consumer` (librdkafka only) the member speaks KIP-848's consumer protocol: the
coordinator assigns (`--assignor` names its server-side assignor, uniform or range), and
assignments change incrementally. SIGTERM
closes the consumer cleanly (leaving the group); SIGKILL is what the tests use for crashes.
"""

import argparse
import signal
import sys
import time

SESSION_TIMEOUT_MS = 4000
HEARTBEAT_MS = 400

stop = False


def on_term(*_):
    global stop
    stop = True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lib", choices=["confluent", "kafka-python"])
    ap.add_argument("bootstrap")
    ap.add_argument("group")
    ap.add_argument("topic")
    ap.add_argument("out")
    ap.add_argument("--assignor", default="roundrobin")
    ap.add_argument("--delay", type=float, default=0.0, help="seconds of work per record")
    ap.add_argument("--protocol", choices=["classic", "consumer"], default="classic")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, on_term)
    out = open(args.out, "a", buffering=1)
    assigned = set()

    def note_assignment(parts):
        out.write(f"A {time.time():.3f} {','.join(str(p) for p in sorted(parts))}\n")
        out.flush()

    if args.lib == "confluent":
        from confluent_kafka import Consumer

        conf = {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "client.id": f"member-{args.out.rsplit('/', 1)[-1]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
        if args.protocol == "consumer":
            # timeouts and the assignor are the coordinator's (group configs)
            conf.update({"group.protocol": "consumer", "group.remote.assignor": args.assignor})
        else:
            conf.update({"session.timeout.ms": SESSION_TIMEOUT_MS,
                         "heartbeat.interval.ms": HEARTBEAT_MS,
                         "partition.assignment.strategy": args.assignor})
        c = Consumer(conf)
        incremental = args.assignor == "cooperative-sticky" or args.protocol == "consumer"

        def on_assign(consumer, partitions):
            if incremental:
                assigned.update(p.partition for p in partitions)
                consumer.incremental_assign(partitions)
            else:
                assigned.clear()
                assigned.update(p.partition for p in partitions)
            note_assignment(assigned)

        def on_revoke(consumer, partitions):
            if incremental:
                assigned.difference_update(p.partition for p in partitions)
                consumer.incremental_unassign(partitions)
                note_assignment(assigned)

        c.subscribe([args.topic], on_assign=on_assign, on_revoke=on_revoke)
        while not stop:
            msgs = c.consume(200, 0.2)
            wrote = False
            for m in msgs:
                if m.error():
                    continue
                out.write(f"R {m.partition()} {m.offset()} {m.value().decode()}\n")
                wrote = True
                if args.delay:
                    time.sleep(args.delay)
            if wrote:
                out.flush()
                try:
                    c.commit(asynchronous=False)
                except Exception as e:  # a rebalance raced the commit: records come again
                    print(f"commit failed: {e}", file=sys.stderr, flush=True)
        c.close()
    else:
        from kafka import KafkaConsumer, ConsumerRebalanceListener
        from kafka.coordinator.assignors.range import RangePartitionAssignor
        from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

        assignor = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor}[args.assignor]
        c = KafkaConsumer(
            bootstrap_servers=args.bootstrap,
            group_id=args.group,
            client_id=f"member-{args.out.rsplit('/', 1)[-1]}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=HEARTBEAT_MS,
            partition_assignment_strategy=[assignor],
        )

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):
                pass

            def on_partitions_assigned(self, partitions):
                assigned.clear()
                assigned.update(p.partition for p in partitions)
                note_assignment(assigned)

        c.subscribe([args.topic], listener=Listener())
        while not stop:
            batches = c.poll(200, max_records=200)
            wrote = False
            for tp, msgs in batches.items():
                for m in msgs:
                    out.write(f"R {m.partition} {m.offset} {m.value.decode()}\n")
                    wrote = True
                    if args.delay:
                        time.sleep(args.delay)
            if wrote:
                out.flush()
                try:
                    c.commit()
                except Exception as e:
                    print(f"commit failed: {e}", file=sys.stderr, flush=True)
        c.close()


if __name__ == "__main__":
    main()
