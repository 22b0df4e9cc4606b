"""Which of librdkafka's broker tests run in which set (tests/librdkafka/run_suite.py).

Test numbers: the runner's TESTS= granularity (every broker test of a number runs in one
invocation). Keep these in step with the latest full run recorded in docs/kafka-compatibility.md,
"librdkafka's integration suite".
"""

# --set quick: passed every run against `strata dev` and take seconds each (about 3 minutes
# together). Producer, consumer, groups (with the 3 s initial rebalance delay), ordered offset
# commits (0030), commits across a rebalance (0118), admin metadata, compression, headers,
# idempotence, the KIP-74 fetch limit (0082) and aborted-transaction filtering (0129). Run in full: the runner's -Q quick mode
# skips sub-tests not marked quick, and some tests then pass having done nothing.
QUICK = [
    "0001", "0002", "0003", "0005", "0007", "0008", "0012", "0013", "0014", "0017", "0019",
    "0021", "0022", "0030", "0031", "0034", "0035", "0036", "0039", "0040", "0041", "0042",
    "0044", "0048", "0054", "0056", "0057", "0063", "0064", "0065", "0067", "0070", "0073",
    "0082", "0085", "0086", "0090", "0099", "0112", "0118", "0129",
]

# Run on a 3 controller + 3 broker cluster instead of the single node: they create topics with
# replication factor 3 (0101 also reads each broker's broker.rack, RACK<id> on this cluster;
# 0126 and 0142 are in SECURE too, and get a cluster whose brokers have the secure listeners).
CLUSTER = ["0101", "0103", "0107", "0111", "0126", "0142"]

# Not in --set full, with the reason: it needs Kafka's Java client. It still runs with
# --set all or when named in --tests.
EXCLUDED = {
    "0098": "needs Kafka's Java client (KAFKA_PATH) to produce its transactions",
}

# The security tests, with their profile (run_suite.SECURE_PROFILES). They run last, with a
# second build of librdkafka with OpenSSL and libcurl (build-secure/), on nodes of their own
# (0126 and 0142, in CLUSTER, on a 3 + 3 cluster) whose brokers have, besides the PLAINTEXT
# listener, SSL with client_auth "required", SSL with "requested" (SSL_REQUESTED), SASL_SSL
# and SASL_PLAINTEXT (SCRAM-SHA-256, SCRAM-SHA-512, PLAIN, OAUTHBEARER; connections_max_reauth
# 5 s), TLS 1.2 only as trivup's brokers. The certificates (and 0097's SSL_* environment) come
# from tests/librdkafka/secure.py; the SCRAM user is made through the PLAINTEXT listener; the
# JWKS the brokers trust for OAUTHBEARER, and the identity provider that signs with its key,
# from tests/librdkafka/oidc_idp.py. test.conf points the test at its listener:
#   ssl / ssl-requested: SSL with the CA, a client certificate and its (encrypted) key, on the
#     required / requested listener. 0097 runs on "requested": on "required" it fails only
#     because Strata answers an empty client certificate with alert 116 where Kafka sends 42
#     (docs/kafka-compatibility.md); `--secure-profile 0097=ssl` runs it there.
#   sasl: SASL_SSL, SCRAM-SHA-256;  sasl-plain: SASL_SSL, PLAIN (the same user and password)
#   oidc: SASL_PLAINTEXT, OAUTHBEARER with sasl.oauthbearer.method=OIDC against the identity
#     provider (started for the test, on 127.0.0.1): client_credentials, the jwt-bearer grant
#     with the client's keys, Azure IMDS metadata authentication, and the expired and forged
#     tokens and refused requests 0126 expects to fail (its VALID_OIDC_URL etc. environment,
#     as trivup's OauthbearerOIDCApp and LibrdkafkaTestApp set it)
SECURE = {"0097": "ssl-requested", "0126": "oidc", "0135": "sasl-plain", "0142": "sasl"}

# Tests that shell out to kafka-topics.sh / kafka-acls.sh (the shims in tests/librdkafka/bin
# need confluent_kafka).
NEEDS_SHIM = ["0045", "0052", "0077", "0109", "0115", "0119"]

# Lines that mean a test failed though the runner says PASSED: librdkafka's C++ test_assert()
# only prints its message (0101 checks where the bytes came from that way).
FAILS_IF_LOGGED = {"0101": ["rxbytes was not highest", "expecting rxbytes of client.rack broker"]}

# With TEST_CONSUMER_GROUP_PROTOCOL=consumer (KIP-848), tests whose expectations hold for the
# classic protocol only; reported as skipped with the reason. Both expect a lone member to
# see every partition revoked and assigned again (the EAGER events of classic's default
# range,roundrobin assignors) when its topic grows or another subscribed topic is deleted.
# Kafka 4.0's coordinator, like Strata's, keeps the partitions that stay (it sends {0..3}
# for a topic grown from 2 to 4; {g} once f is deleted), and librdkafka then emits ASSIGN of
# the new partitions only / REVOKE of f's and an empty ASSIGN; librdkafka's own CI runs
# neither in consumer mode (they need the noautocreate scenario), and its regex sub-test
# already branches on the protocol for this reason.
CLASSIC_ONLY = {
    "0045_subscribe_update_non_exist_and_partchange":
        "expects classic's revoke-all / assign-all when a topic grows; the consumer protocol "
        "keeps the partitions that stay, as Kafka 4.0 does",
    "0045_subscribe_update_topic_remove":
        "expects classic's revoke-all / assign-all when a subscribed topic is deleted; the "
        "consumer protocol revokes only the deleted topic's partitions, as Kafka 4.0 does",
}

# Seconds before a test number's runner is killed, where --timeout's default (600) is too short:
# 0113 runs some forty cooperative-rebalance sub-tests, each waiting out rebalances.
TIMEOUTS = {"0113": 1800}

# test.timeout.multiplier in a test's test.conf, where its own budget cannot hold what it does
# against any broker. 0126 gives itself 60 s for some 100 s of fixed waits: seven produce and
# consume sub-tests that each sleep 5 s for a token refresh, and six that wait 5 to 10 s for
# the error they expect. librdkafka's CI runs it with CI set, which adds 2 to the multiplier
# (180 s); from test.conf the runner applies the multiplier twice (60 s x 2 x 2 = 240 s).
# Only the budget and the waits for something to happen grow: a passing run takes as long.
TIMEOUT_MULTIPLIERS = {"0126": 2}

# [groups] initial_rebalance_delay for the node a test runs on, where Strata's default (3 s,
# Kafka's group.initial.rebalance.delay.ms) does not fit the test's own time budget. These
# tests get a node of their own with the delay Kafka's shipped config/server.properties sets
# for development (0). 0081 runs some forty consumer joins, each waiting out the delay,
# inside one 180 s budget; every sub-test passes with either delay. 0030, 0040, 0056 and
# 0129 pass with either delay too and only wait it out (0030's seven groups: 61-67 s with
# 3 s, 27 s with 0): they share that node to keep the quick set short. The delay itself
# stays covered by 0118 (which needs it), tests/test_groups.py and the rest of the set.
REBALANCE_DELAYS = {"0081": "0s", "0030": "0s", "0040": "0s", "0056": "0s", "0129": "0s"}
