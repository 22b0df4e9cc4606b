//! Produce and InitProducerId.
//!
//! Batches are validated (CRC, size, one v2 batch per partition) and appended while the
//! request is dispatched, in connection order; only the wait for durability (acks=all) runs
//! later. acks=0 gets no response at all, as in Kafka.

use super::quota::QuotaKey;
use std::time::Duration;

use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{
    InitProducerIdRequest, InitProducerIdResponse, ProduceRequest, ProduceResponse, ProducerId,
};
use kafka_protocol::protocol::StrBytes;

use strata_controller::metadata::acl::{Operation, ResourceType, CLUSTER_NAME};

use std::collections::HashMap;

use super::{codes, Refusal, Reply, Request};
use crate::broker::{Broker, PendingAppend, ProduceError};
use crate::log::{AppendError, TxnVerified};

/// KIP-890: what verification found for a produce request's transactional batches before
/// it was dispatched, by (topic, partition): the guard to append under, or the refusal.
#[derive(Debug, Default)]
pub struct Verifications(HashMap<(String, i32), Result<TxnVerified, codes::Coded>>);

/// A partition to ask about, with the guard its leader handed out: (topic, partition, guard).
type Guarded = (String, i32, u64);

/// Verifies the transactional batches of `req` that would open a transaction on a
/// partition led here: the transactional id's coordinator (here or on another broker) must
/// say the partition is in the producer's open transaction. Awaited before the request is
/// dispatched, so the connection's requests still append in order; batches whose
/// transaction is already open here need no question. `may_write`: whether the principal
/// may write as the request's transactional id (otherwise the request is refused anyway).
pub(crate) async fn verify(
    broker: &Broker,
    req: &ProduceRequest,
    may_write: bool,
) -> Verifications {
    let mut out = Verifications::default();
    let Some(id) = req
        .transactional_id
        .as_ref()
        .map(|t| t.as_str())
        .filter(|t| !t.is_empty())
    else {
        return out;
    };
    if !may_write || !broker.txns().verifies() {
        return out;
    }
    let mut ask: HashMap<(i64, i16), Vec<Guarded>> = HashMap::new();
    for topic in &req.topic_data {
        for pd in &topic.partition_data {
            let Some(h) = pd
                .records
                .as_ref()
                .and_then(|r| strata_core::batch::BatchHeader::parse(r).ok())
            else {
                continue; // the append refuses it
            };
            if !h.is_transactional() || !h.has_producer_id() {
                continue;
            }
            let name = topic.name.0.to_string();
            match broker.txn_guard(&name, pd.index, h.producer_id, h.producer_epoch) {
                None => {} // not led here: the append says so
                Some(None) => {
                    out.0.insert((name, pd.index), Ok(TxnVerified::AlreadyOpen));
                }
                Some(Some(guard)) => ask
                    .entry((h.producer_id, h.producer_epoch))
                    .or_default()
                    .push((name, pd.index, guard)),
            }
        }
    }
    for ((producer_id, epoch), parts) in ask {
        let names: Vec<(String, i32)> = parts.iter().map(|(t, p, _)| (t.clone(), *p)).collect();
        let answers = broker.txns().verify(id, producer_id, epoch, &names).await;
        for ((topic, index, guard), answer) in parts.into_iter().zip(answers) {
            let outcome = match answer {
                Ok(()) => Ok(TxnVerified::Guard(guard)),
                Err(code) => Err((
                    code,
                    format!(
                        "{topic}-{index} is not in the open transaction of transactional id \
                         {id} (producer {producer_id}, epoch {epoch}), as its coordinator \
                         answers (KIP-890): add the partition to the transaction first; a \
                         late batch of an ended transaction cannot reopen it"
                    ),
                )),
            };
            out.0.insert((topic, index), outcome);
        }
    }
    out
}

/// One partition's outcome so far: a final answer, or an append waiting to become durable.
struct PartitionOutcome {
    index: i32,
    base_offset: i64,
    log_start: i64,
    log_append_time: i64,
    error: Option<codes::Coded>,
    /// The records that made the batch invalid (KIP-467's `batch_index`es).
    bad_records: Vec<i32>,
    wait: Option<PendingAppend>,
}

impl PartitionOutcome {
    fn failed(index: i32, error: codes::Coded) -> Self {
        PartitionOutcome {
            index,
            base_offset: -1,
            log_start: -1,
            log_append_time: -1,
            error: Some(error),
            bad_records: Vec::new(),
            wait: None,
        }
    }
}

/// One connection's partitions whose last produce was refused before anything was appended,
/// with a retriable error, and that error.
///
/// A client keeps up to five produce requests in flight per connection. If the first is
/// refused (this broker's lease lapsed for a moment: NOT_LEADER_OR_FOLLOWER; the ISR was
/// short: NOT_ENOUGH_REPLICAS) and the cause is gone by the time the second is handled, the
/// second finds a gap in the producer's sequence. Answering it OUT_OF_ORDER_SEQUENCE_NUMBER
/// makes librdkafka bump its producer epoch and renumber every record it has not had
/// acknowledged, including records that were written but whose acknowledgement it lost (the
/// fault suite saw them appended twice). So the second gets the first one's answer: nothing
/// was appended, retry; the client then resends both in order.
#[derive(Default)]
pub(crate) struct Refused(HashMap<(String, i32), codes::Coded>);

impl Refused {
    /// The answer to one partition's produce on this connection.
    fn settle<T>(
        &mut self,
        topic: &str,
        index: i32,
        result: Result<T, ProduceError>,
    ) -> Result<T, codes::Coded> {
        // The common case (appended, nothing refused before) allocates nothing.
        let result = match result {
            Ok(v) if self.0.is_empty() => return Ok(v),
            other => other,
        };
        let key = (topic.to_string(), index);
        match result {
            Ok(v) => {
                self.0.remove(&key);
                Ok(v)
            }
            Err(ProduceError::Append(AppendError::OutOfOrderSequence { expected, got }))
                if got.wrapping_sub(expected) > 0 && self.0.contains_key(&key) =>
            {
                let (code, why) = &self.0[&key];
                Err((
                    *code,
                    format!(
                        "sequence {got} follows a batch this connection had refused ({why}); \
                         nothing was appended: retry from sequence {expected}"
                    ),
                ))
            }
            Err(e) => {
                let coded = codes::produce(&e);
                match e {
                    ProduceError::NotLeader { .. } | ProduceError::NotEnoughReplicas(_) => {
                        self.0.insert(key, coded.clone());
                    }
                    _ => {
                        self.0.remove(&key);
                    }
                }
                Err(coded)
            }
        }
    }
}

pub(super) fn handle(
    ctx: Request,
    req: ProduceRequest,
    verified: Verifications,
    refused: &mut Refused,
) -> Result<Reply, Refusal> {
    let broker = ctx.broker().clone();
    let started = std::time::Instant::now();
    let now = broker.now_ms();
    let acks = req.acks;
    let refuse_all: Option<codes::Coded> = if !matches!(acks, -1..=1) {
        Some((
            codes::INVALID_REQUIRED_ACKS,
            format!("acks={acks} is not one of -1, 0, 1"),
        ))
    } else if let Some(id) = req
        .transactional_id
        .as_ref()
        .filter(|t| !t.0.is_empty())
        .filter(|t| !ctx.permits(Operation::Write, ResourceType::TransactionalId, t.as_str()))
    {
        Some((
            codes::TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            format!(
                "{} may not write as transactional id {}",
                ctx.principal,
                id.as_str()
            ),
        ))
    } else {
        None
    };
    let verifies = broker.txns().verifies();
    let mut topics = Vec::with_capacity(req.topic_data.len());
    // record bytes offered, for the producer_byte_rate quota (appended or not, as Kafka
    // counts the request)
    let mut offered = 0usize;
    for topic in req.topic_data {
        let name = topic.name.0.to_string();
        let mut outcomes = Vec::with_capacity(topic.partition_data.len());
        for pd in topic.partition_data {
            if let Some(e) = &refuse_all {
                outcomes.push(PartitionOutcome::failed(pd.index, e.clone()));
                continue;
            }
            if !ctx.may_topic(Operation::Write, &name) {
                outcomes.push(PartitionOutcome::failed(
                    pd.index,
                    (
                        codes::TOPIC_AUTHORIZATION_FAILED,
                        format!("{} may not write to {name}", ctx.principal),
                    ),
                ));
                continue;
            }
            let Some(records) = pd.records else {
                outcomes.push(PartitionOutcome::failed(
                    pd.index,
                    (
                        codes::CORRUPT_MESSAGE,
                        "produce request carries no records".into(),
                    ),
                ));
                continue;
            };
            offered += records.len();
            // (most requests carry no transactional batch: no key to build)
            let verdict = if verified.0.is_empty() {
                None
            } else {
                verified.0.get(&(name.clone(), pd.index)).cloned()
            };
            if let Some(Err(coded)) = verdict {
                outcomes.push(PartitionOutcome::failed(pd.index, coded));
                continue;
            }
            // with verification on, a transactional batch nobody verified may only join a
            // transaction already open on the partition
            let verdict = match verdict {
                Some(v) => v.ok(),
                None => verifies.then_some(TxnVerified::AlreadyOpen),
            };
            let appended = broker.append_verified(&name, pd.index, records, acks, verdict, now);
            let bad_records = match &appended {
                Err(ProduceError::Records { error, .. }) => error.record_indexes(),
                _ => Vec::new(),
            };
            match refused.settle(&name, pd.index, appended) {
                Ok(pending) => outcomes.push(PartitionOutcome {
                    index: pd.index,
                    base_offset: pending.base_offset() as i64,
                    log_start: pending.log_start() as i64,
                    log_append_time: pending.log_append_time_ms(),
                    error: None,
                    bad_records: Vec::new(),
                    wait: Some(pending),
                }),
                Err(coded) => outcomes.push(PartitionOutcome {
                    bad_records,
                    ..PartitionOutcome::failed(pd.index, coded)
                }),
            }
        }
        topics.push((topic.name, outcomes));
    }
    let throttle_ms = if offered > 0 {
        ctx.throttle(QuotaKey::ProducerByteRate, offered as f64)
    } else {
        0
    };
    if acks == 0 {
        broker.metrics().produce_latency.observe(started.elapsed());
        return Ok(Reply::Nothing);
    }
    let timeout = Duration::from_millis(req.timeout_ms.max(0) as u64);
    ctx.later(async move {
        let mut responses = Vec::with_capacity(topics.len());
        for (name, outcomes) in topics {
            let mut partition_responses = Vec::with_capacity(outcomes.len());
            for mut o in outcomes {
                if let Some(pending) = o.wait.take() {
                    if let Err(e) = pending
                        .durable(timeout, &broker.metrics().commit_latency)
                        .await
                    {
                        o.error = Some(codes::wait(&e));
                    }
                }
                let (code, message) = o.error.unwrap_or((codes::NONE, String::new()));
                // KIP-467 (v8+): the record that made the batch invalid, so a client can
                // tell which record its application must fix
                let record_errors = o
                    .bad_records
                    .iter()
                    .map(|&i| {
                        BatchIndexAndErrorMessage::default()
                            .with_batch_index(i)
                            .with_batch_index_error_message(Some(StrBytes::from_string(
                                message.clone(),
                            )))
                    })
                    .collect();
                partition_responses.push(
                    PartitionProduceResponse::default()
                        .with_index(o.index)
                        .with_error_code(code)
                        .with_record_errors(record_errors)
                        .with_error_message(
                            (code != codes::NONE).then(|| StrBytes::from_string(message)),
                        )
                        .with_base_offset(if code == codes::NONE {
                            o.base_offset
                        } else {
                            -1
                        })
                        .with_log_append_time_ms(if code == codes::NONE {
                            o.log_append_time
                        } else {
                            -1
                        })
                        .with_log_start_offset(o.log_start),
                );
            }
            responses.push(
                TopicProduceResponse::default()
                    .with_name(name)
                    .with_partition_responses(partition_responses),
            );
        }
        broker.metrics().produce_latency.observe(started.elapsed());
        ProduceResponse::default()
            .with_responses(responses)
            .with_throttle_time_ms(throttle_ms)
    })
}

pub(super) async fn init_producer_id(
    ctx: Request,
    req: InitProducerIdRequest,
) -> InitProducerIdResponse {
    // (A transactional id goes to its coordinator, see super::txn; Kafka treats an empty
    // one like none: a plain idempotent producer.)
    // Kafka (KIP-679): IdempotentWrite on the cluster, or Write on any topic.
    let may_write = ctx.permits(
        Operation::IdempotentWrite,
        ResourceType::Cluster,
        CLUSTER_NAME,
    ) || ctx
        .broker()
        .topics()
        .iter()
        .any(|t| ctx.permits(Operation::Write, ResourceType::Topic, &t.spec.name));
    if !may_write {
        tracing::info!(principal = %ctx.principal, peer = %ctx.peer, "InitProducerId denied by ACLs (no IdempotentWrite on the cluster, no Write on any topic)");
        return InitProducerIdResponse::default()
            .with_error_code(codes::CLUSTER_AUTHORIZATION_FAILED)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
    }
    // KIP-360: an idempotent producer may ask to bump its epoch to reset its sequences.
    if req.producer_id.0 >= 0 && req.producer_epoch >= 0 && req.producer_epoch < i16::MAX - 1 {
        return InitProducerIdResponse::default()
            .with_producer_id(req.producer_id)
            .with_producer_epoch(req.producer_epoch + 1);
    }
    match ctx.broker().allocate_producer_id().await {
        Ok(id) => InitProducerIdResponse::default()
            .with_producer_id(ProducerId(id))
            .with_producer_epoch(0),
        Err(e) => {
            tracing::error!(error = %e, "cannot reserve producer ids");
            InitProducerIdResponse::default()
                .with_error_code(codes::KAFKA_STORAGE_ERROR)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ooo(expected: i32, got: i32) -> Result<(), ProduceError> {
        Err(ProduceError::Append(AppendError::OutOfOrderSequence {
            expected,
            got,
        }))
    }

    fn not_leader() -> Result<(), ProduceError> {
        Err(ProduceError::NotLeader {
            topic: "settlements".into(),
            partition: 4,
            leader: Some(1),
        })
    }

    /// The fault suite's duplicate: R1 (sequence 833) refused with NOT_LEADER_OR_FOLLOWER
    /// while the lease had lapsed, R2 (837) handled once it was renewed. R2 must not be
    /// answered OUT_OF_ORDER_SEQUENCE_NUMBER (librdkafka then bumps its epoch and re-sends
    /// records already written); it gets R1's answer until an in-order batch arrives.
    #[test]
    fn a_gap_left_by_a_refused_batch_is_answered_like_the_refusal() {
        let out_of_order = kafka_protocol::ResponseError::OutOfOrderSequenceNumber.code();
        let short = || {
            Err(ProduceError::NotEnoughReplicas(
                "settlements-1: 1 < 2".into(),
            ))
        };
        // (partition, what the log said, the answer on this connection)
        let steps: Vec<(i32, Result<(), ProduceError>, i16)> = vec![
            (4, not_leader(), codes::NOT_LEADER_OR_FOLLOWER),
            (4, ooo(833, 837), codes::NOT_LEADER_OR_FOLLOWER),
            (4, ooo(833, 851), codes::NOT_LEADER_OR_FOLLOWER),
            // another partition keeps its own answers
            (5, ooo(476, 478), out_of_order),
            // the resend in order is appended; after that a gap is a gap again
            (4, Ok(()), codes::NONE),
            (4, ooo(900, 905), out_of_order),
            // NOT_ENOUGH_REPLICAS likewise (an ISR that grew back between the two)
            (1, short(), codes::NOT_ENOUGH_REPLICAS),
            (1, ooo(1099, 1100), codes::NOT_ENOUGH_REPLICAS),
            // a stale retry (behind the expected sequence) is not a gap: its own answer
            (1, ooo(1099, 1000), out_of_order),
        ];
        let mut r = Refused::default();
        for (i, (partition, logged, answer)) in steps.into_iter().enumerate() {
            let got = r
                .settle("settlements", partition, logged)
                .err()
                .map_or(codes::NONE, |(code, _)| code);
            assert_eq!(got, answer, "step {i}");
        }
    }
}
