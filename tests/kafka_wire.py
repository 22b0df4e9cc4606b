"""A minimal Kafka wire client for tests that must say exactly what a producer sends:
InitProducerId v0 and Produce v3 with a hand-set producer id, epoch and sequence, so a test can
resend an idempotent batch the way a producer whose answer was lost does. Batches are built by
kafka-python's RecordBatch v2 builder (CRC included); the framing is the protocol's own."""

import socket
import struct

from kafka.record.default_records import DefaultRecordBatchBuilder


def varint(v):
    """A zigzag varint, as records encode their lengths and deltas."""
    z = (v << 1) ^ (v >> 63)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def record(value, key=None, offset_delta=0):
    """One record of a v2 batch's records section (no headers)."""
    def field(b):
        return varint(-1) if b is None else varint(len(b)) + b
    body = b"\x00" + varint(0) + varint(offset_delta) + field(key) + field(value) + varint(0)
    return varint(len(body)) + body


def raw_batch(base_offset, attributes, body, timestamp, count=1):
    """A RecordBatch v2 of `count` records whose records section is `body`, compressed as
    `attributes` says (1 gzip, 2 snappy, 3 lz4, 4 zstd), CRC included: what any producer
    can write, whatever `body` holds."""
    from kafka.record.util import calc_crc32c

    after_crc = struct.pack(">hiqqqhii", attributes, count - 1, timestamp, timestamp, -1, -1, -1, count) + body
    head = struct.pack(">qiib", base_offset, 4 + 1 + 4 + len(after_crc), 0, 2)
    return head + struct.pack(">I", calc_crc32c(after_crc)) + after_crc


def string(s):
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def nullable_string(s):
    return struct.pack(">h", -1) if s is None else string(s)


class KafkaWire:
    def __init__(self, port, timeout=10, host="127.0.0.1"):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.correlation = 0

    def close(self):
        self.sock.close()

    def _recv_exact(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            buf += chunk
        return buf

    def call(self, api_key, version, body):
        """Sends one request (header v1) and returns the response body after its correlation id."""
        self.correlation += 1
        client = b"strata-test"
        header = struct.pack(">hhih", api_key, version, self.correlation, len(client)) + client
        frame = header + body
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        (size,) = struct.unpack(">i", self._recv_exact(4))
        resp = self._recv_exact(size)
        (correlation,) = struct.unpack(">i", resp[:4])
        assert correlation == self.correlation, (correlation, self.correlation)
        return resp[4:]

    def init_producer_id(self):
        """(producer id, epoch) from InitProducerId v0, without a transactional id."""
        body = struct.pack(">hi", -1, 60000)
        throttle, error, pid, epoch = struct.unpack(">ihqh", self.call(22, 0, body))
        assert error == 0, f"InitProducerId error {error}"
        return pid, epoch

    def produce(self, topic, partition, values, producer_id, producer_epoch, base_sequence, acks=-1):
        """One idempotent batch of `values` (bytes) with Produce v3; (error code, base offset)."""
        builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False,
                                            producer_id=producer_id, producer_epoch=producer_epoch,
                                            base_sequence=base_sequence, batch_size=1 << 20)
        for i, v in enumerate(values):
            builder.append(i, timestamp=None, key=None, value=v, headers=[])
        return self.produce_raw(topic, partition, bytes(builder.build()), acks)

    def produce_raw(self, topic, partition, records, acks=-1, transactional_id=None):
        """One partition's records, exactly these bytes, with Produce v3; (error code, base
        offset)."""
        name = topic.encode()
        body = (nullable_string(transactional_id) + struct.pack(">hi", acks, 30000) + struct.pack(">i", 1)
                + struct.pack(">h", len(name)) + name + struct.pack(">i", 1)
                + struct.pack(">ii", partition, len(records)) + records)
        resp = self.call(0, 3, body)
        # responses: [topic: name, [partition: index, error, base offset, log append time]]
        (n_topics,) = struct.unpack_from(">i", resp, 0)
        assert n_topics == 1
        (name_len,) = struct.unpack_from(">h", resp, 4)
        at = 6 + name_len
        (n_parts,) = struct.unpack_from(">i", resp, at)
        assert n_parts == 1
        index, error, base_offset, _append_time = struct.unpack_from(">ihqq", resp, at + 4)
        assert index == partition
        return error, base_offset

    # --- transactions (KIP-98), as a producer sends them ------------------------------

    def find_coordinator(self, key, key_type):
        """FindCoordinator v1 (key_type 0: group, 1: transactional id): (error, node id)."""
        resp = self.call(10, 1, string(key) + struct.pack(">b", key_type))
        _throttle, error, msg_len = struct.unpack_from(">ihh", resp, 0)
        at = 8 + max(msg_len, 0)
        (node,) = struct.unpack_from(">i", resp, at)
        return error, node

    def init_transactional_producer(self, transactional_id, timeout_ms=60000):
        """InitProducerId v0 with a transactional id: (error, producer id, epoch)."""
        body = string(transactional_id) + struct.pack(">i", timeout_ms)
        _throttle, error, pid, epoch = struct.unpack(">ihqh", self.call(22, 0, body))
        return error, pid, epoch

    def add_partitions_to_txn(self, transactional_id, producer_id, epoch, topic, partitions):
        """AddPartitionsToTxn v0 for one topic: {partition: error code}."""
        body = (string(transactional_id) + struct.pack(">qh", producer_id, epoch)
                + struct.pack(">i", 1) + string(topic) + struct.pack(">i", len(partitions))
                + b"".join(struct.pack(">i", p) for p in partitions))
        resp = self.call(24, 0, body)
        at = 4
        (n_topics,) = struct.unpack_from(">i", resp, at)
        assert n_topics == 1
        (name_len,) = struct.unpack_from(">h", resp, at + 4)
        at += 6 + name_len
        (n,) = struct.unpack_from(">i", resp, at)
        at += 4
        out = {}
        for _ in range(n):
            p, err = struct.unpack_from(">ih", resp, at)
            at += 6
            out[p] = err
        return out

    def end_txn(self, transactional_id, producer_id, epoch, commit):
        """EndTxn v0: its error code."""
        body = string(transactional_id) + struct.pack(">qh?", producer_id, epoch, commit)
        _throttle, error = struct.unpack(">ih", self.call(26, 0, body))
        return error

    def produce_txn(self, topic, partition, values, transactional_id, producer_id,
                    producer_epoch, base_sequence):
        """One transactional batch of `values` with Produce v3 under `transactional_id`,
        whether or not the partition was added to the transaction: (error, base offset)."""
        builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True,
                                            producer_id=producer_id, producer_epoch=producer_epoch,
                                            base_sequence=base_sequence, batch_size=1 << 20)
        for i, v in enumerate(values):
            builder.append(i, timestamp=None, key=None, value=v, headers=[])
        return self.produce_raw(topic, partition, bytes(builder.build()),
                                transactional_id=transactional_id)

    def stable_offset(self, topic, partition):
        """(error code, last stable offset) from ListOffsets v2 at `latest` with
        isolation_level read_committed, as a read_committed consumer asks."""
        body = (struct.pack(">ib", -1, 1) + struct.pack(">i", 1) + string(topic)
                + struct.pack(">iiq", 1, partition, -1))
        resp = self.call(2, 2, body)
        (name_len,) = struct.unpack_from(">h", resp, 8)
        at = 10 + name_len + 4
        index, error, _ts, offset = struct.unpack_from(">ihqq", resp, at)
        assert index == partition
        return error, offset

    def latest_offset(self, topic, partition):
        """(error code, high watermark) from ListOffsets v1 at `latest` (-1), as a consumer asks."""
        name = topic.encode()
        body = (struct.pack(">ii", -1, 1) + struct.pack(">h", len(name)) + name
                + struct.pack(">iiq", 1, partition, -1))
        resp = self.call(2, 1, body)
        (name_len,) = struct.unpack_from(">h", resp, 4)
        at = 6 + name_len + 4
        index, error, _ts, offset = struct.unpack_from(">ihqq", resp, at)
        assert index == partition
        return error, offset

    def partition_leaders(self, topic):
        """{partition: leader id (-1: none)} for `topic` from Metadata v0, as this broker answers."""
        name = topic.encode()
        resp = self.call(3, 0, struct.pack(">ih", 1, len(name)) + name)
        at = 0
        (n_brokers,) = struct.unpack_from(">i", resp, at)
        at += 4
        for _ in range(n_brokers):
            at += 4
            (host_len,) = struct.unpack_from(">h", resp, at)
            at += 2 + host_len + 4
        (n_topics,) = struct.unpack_from(">i", resp, at)
        at += 4
        leaders = {}
        for _ in range(n_topics):
            _error, name_len = struct.unpack_from(">hh", resp, at)
            at += 4 + name_len
            (n_parts,) = struct.unpack_from(">i", resp, at)
            at += 4
            for _ in range(n_parts):
                _perror, index, leader = struct.unpack_from(">hii", resp, at)
                at += 10
                for _list in range(2):  # replicas, isr
                    (n,) = struct.unpack_from(">i", resp, at)
                    at += 4 + 4 * n
                leaders[index] = leader
        return leaders

    def broker_ids(self):
        """The broker ids a Metadata v0 answer (for no topic) lists."""
        resp = self.call(3, 0, struct.pack(">i", 0))
        (n_brokers,) = struct.unpack_from(">i", resp, 0)
        at, ids = 4, []
        for _ in range(n_brokers):
            (node,) = struct.unpack_from(">i", resp, at)
            (host_len,) = struct.unpack_from(">h", resp, at + 4)
            at += 4 + 2 + host_len + 4
            ids.append(node)
        return ids

    def incremental_alter_configs(self, resource_type, name, ops, validate_only=False):
        """IncrementalAlterConfigs v0 of one resource, any name ("" included, which Kafka's
        admin clients do not let a test send); ops: (config, operation, value or None).
        Returns (error code, error message)."""
        def string(s):
            b = s.encode()
            return struct.pack(">h", len(b)) + b

        body = struct.pack(">i", 1) + struct.pack(">b", resource_type) + string(name)
        body += struct.pack(">i", len(ops))
        for config, op, value in ops:
            body += string(config) + struct.pack(">b", op)
            body += struct.pack(">h", -1) if value is None else string(value)
        body += struct.pack(">?", validate_only)
        resp = self.call(44, 0, body)
        (n,) = struct.unpack_from(">i", resp, 4)
        assert n == 1
        error, msg_len = struct.unpack_from(">hh", resp, 8)
        msg = None if msg_len < 0 else resp[12:12 + msg_len].decode()
        return error, msg

    def describe_configs(self, resource_type, name):
        """DescribeConfigs v1 of one resource (all its configs): (error code,
        {config: (value, source)})."""
        b = name.encode()
        body = (struct.pack(">ibh", 1, resource_type, len(b)) + b + struct.pack(">i", -1)
                + struct.pack(">?", False))
        resp = self.call(32, 1, body)
        at = 4
        (n,) = struct.unpack_from(">i", resp, at)
        assert n == 1
        at += 4

        def nullable_string():
            nonlocal at
            (length,) = struct.unpack_from(">h", resp, at)
            at += 2
            if length < 0:
                return None
            s = resp[at:at + length].decode()
            at += length
            return s

        (error,) = struct.unpack_from(">h", resp, at)
        at += 2
        nullable_string()  # error message
        at += 1  # resource type
        nullable_string()  # resource name
        (count,) = struct.unpack_from(">i", resp, at)
        at += 4
        configs = {}
        for _ in range(count):
            config = nullable_string()
            value = nullable_string()
            _read_only, source, _sensitive = struct.unpack_from(">?b?", resp, at)
            at += 3
            (synonyms,) = struct.unpack_from(">i", resp, at)
            at += 4
            for _ in range(synonyms):
                nullable_string()
                nullable_string()
                at += 1
            configs[config] = (value, source)
        return error, configs
