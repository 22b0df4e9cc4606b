//! The transaction APIs (KIP-98): InitProducerId with a transactional id,
//! AddPartitionsToTxn (v0-3, the client form), AddOffsetsToTxn and EndTxn, answered by the
//! transaction coordinator of the id ([`crate::txn`]). FindCoordinator for transactional
//! ids and TxnOffsetCommit (answered by the group's coordinator) are in [`super::group`].

use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::describe_transactions_response::{
    TopicData, TransactionState as DescribedTxn,
};
use kafka_protocol::messages::list_transactions_response::TransactionState as ListedTxn;
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse, EndTxnRequest, EndTxnResponse, InitProducerIdRequest,
    InitProducerIdResponse, ProducerId,
};
use kafka_protocol::messages::{
    DescribeTransactionsRequest, DescribeTransactionsResponse, ListTransactionsRequest,
    ListTransactionsResponse, TopicName, TransactionalId,
};
use strata_controller::metadata::acl::{Operation, ResourceType};

use super::{codes, Request};

/// Kafka's TRANSACTIONAL_ID_NOT_FOUND.
const TRANSACTIONAL_ID_NOT_FOUND: i16 = 105;

/// OPERATION_NOT_ATTEMPTED: another partition of the request failed.
const OPERATION_NOT_ATTEMPTED: i16 = 55;

fn may_write_id(ctx: &Request, id: &str) -> bool {
    ctx.permits(Operation::Write, ResourceType::TransactionalId, id)
}

/// InitProducerId for transactional id `id`.
pub(super) async fn init_producer_id(
    ctx: Request,
    id: String,
    req: InitProducerIdRequest,
) -> InitProducerIdResponse {
    let failed = |code| {
        InitProducerIdResponse::default()
            .with_error_code(code)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1)
    };
    if !may_write_id(&ctx, &id) {
        return failed(codes::TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
    }
    let coordinator = match ctx.broker().txns().coordinator(&id) {
        Ok(c) => c,
        Err(code) => return failed(code),
    };
    // KIP-360 (v3+): a producer that has an id and epoch asks to bump it
    let hint = (ctx.version >= 3 && req.producer_id.0 >= 0)
        .then_some((req.producer_id.0, req.producer_epoch));
    match coordinator
        .init_producer_id(&id, req.transaction_timeout_ms, hint)
        .await
    {
        Ok((pid, epoch)) => InitProducerIdResponse::default()
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(epoch),
        Err(code) => failed(code),
    }
}

/// A partition of an AddPartitionsToTxn and the error it must answer (`None`: it may be
/// added).
type Checked = (i32, Option<i16>);

pub(super) async fn add_partitions(
    ctx: Request,
    req: AddPartitionsToTxnRequest,
) -> AddPartitionsToTxnResponse {
    let id = req.v3_and_below_transactional_id.to_string();
    let pid = req.v3_and_below_producer_id.0;
    let epoch = req.v3_and_below_producer_epoch;
    let broker = ctx.broker().clone();
    // per partition: the error it must answer, or None if it may be added
    let mut checked: Vec<(kafka_protocol::messages::TopicName, Vec<Checked>)> = Vec::new();
    let mut wanted = Vec::new();
    for t in &req.v3_and_below_topics {
        let name = t.name.0.to_string();
        let topic = broker.topic(&name);
        let refusal = if !ctx.may_topic(Operation::Write, &name) {
            Some(codes::TOPIC_AUTHORIZATION_FAILED)
        } else if crate::group::manager::is_internal(&name) {
            Some(codes::INVALID_REQUEST)
        } else {
            None
        };
        let parts = t
            .partitions
            .iter()
            .map(|&p| {
                let exists = topic
                    .as_ref()
                    .is_some_and(|t| p >= 0 && (p as usize) < t.layout.len());
                let e = refusal.or((!exists).then_some(codes::UNKNOWN_TOPIC_OR_PARTITION));
                if e.is_none() {
                    wanted.push((name.clone(), p));
                }
                (p, e)
            })
            .collect();
        checked.push((t.name.clone(), parts));
    }
    let any_refused = checked
        .iter()
        .any(|(_, ps)| ps.iter().any(|(_, e)| e.is_some()));
    let outcome: i16 = if !may_write_id(&ctx, &id) {
        codes::TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    } else if any_refused {
        OPERATION_NOT_ATTEMPTED
    } else {
        match broker.txns().coordinator(&id) {
            Ok(c) => match c.add_partitions(&id, pid, epoch, &wanted).await {
                Ok(()) => codes::NONE,
                Err(code) => code,
            },
            Err(code) => code,
        }
    };
    let results = checked
        .into_iter()
        .map(|(name, parts)| {
            AddPartitionsToTxnTopicResult::default()
                .with_name(name)
                .with_results_by_partition(
                    parts
                        .into_iter()
                        .map(|(p, e)| {
                            AddPartitionsToTxnPartitionResult::default()
                                .with_partition_index(p)
                                .with_partition_error_code(e.unwrap_or(outcome))
                        })
                        .collect(),
                )
        })
        .collect();
    AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results)
}

/// AddOffsetsToTxn: the group's `__consumer_offsets` partition joins the transaction, so
/// its TxnOffsetCommits take effect with the transaction.
pub(super) async fn add_offsets(
    ctx: Request,
    req: AddOffsetsToTxnRequest,
) -> AddOffsetsToTxnResponse {
    let id = req.transactional_id.to_string();
    let group = req.group_id.0.to_string();
    let broker = ctx.broker().clone();
    let code = if !may_write_id(&ctx, &id) {
        codes::TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    } else if !ctx.may_group(Operation::Read, &group) {
        codes::GROUP_AUTHORIZATION_FAILED
    } else {
        match broker.groups().offsets_partition(&group) {
            Err(code) => code,
            Ok(partition) => match broker.txns().coordinator(&id) {
                Ok(c) => c
                    .add_partitions(&id, req.producer_id.0, req.producer_epoch, &[partition])
                    .await
                    .err()
                    .unwrap_or(codes::NONE),
                Err(code) => code,
            },
        }
    };
    AddOffsetsToTxnResponse::default().with_error_code(code)
}

pub(super) async fn end_txn(ctx: Request, req: EndTxnRequest) -> EndTxnResponse {
    let id = req.transactional_id.to_string();
    if !may_write_id(&ctx, &id) {
        return EndTxnResponse::default()
            .with_error_code(codes::TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
    }
    let code = match ctx.broker().txns().coordinator(&id) {
        Ok(c) => match c
            .end_txn(&id, req.producer_id.0, req.producer_epoch, req.committed)
            .await
        {
            Ok(()) => codes::NONE,
            Err(code) => code,
        },
        Err(code) => code,
    };
    EndTxnResponse::default().with_error_code(code)
}

fn s(v: impl Into<String>) -> kafka_protocol::protocol::StrBytes {
    kafka_protocol::protocol::StrBytes::from_string(v.into())
}

/// DescribeTransactions (v0, KIP-664): each id's state, producer, timeout, start and
/// partitions, from its coordinator (this broker, or NOT_COORDINATOR).
pub(super) async fn describe(
    ctx: Request,
    req: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let mut states = Vec::with_capacity(req.transactional_ids.len());
    for id in req.transactional_ids {
        let name = id.to_string();
        let out = DescribedTxn::default()
            .with_transactional_id(id)
            .with_transaction_state(s(""))
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1)
            .with_transaction_start_time_ms(-1);
        if !ctx.permits(Operation::Describe, ResourceType::TransactionalId, &name) {
            states.push(out.with_error_code(codes::TRANSACTIONAL_ID_AUTHORIZATION_FAILED));
            continue;
        }
        let meta = match ctx.broker().txns().coordinator(&name) {
            Ok(c) => c.get(&name).await,
            Err(code) => {
                states.push(out.with_error_code(code));
                continue;
            }
        };
        let Some(m) = meta else {
            states.push(out.with_error_code(TRANSACTIONAL_ID_NOT_FOUND));
            continue;
        };
        let mut topics: Vec<TopicData> = Vec::new();
        for (t, p) in &m.partitions {
            match topics.last_mut() {
                Some(d) if d.topic.0.as_str() == t => d.partitions.push(*p),
                _ => topics.push(
                    TopicData::default()
                        .with_topic(TopicName(s(t.clone())))
                        .with_partitions(vec![*p]),
                ),
            }
        }
        states.push(
            out.with_transaction_state(s(m.status.name()))
                .with_transaction_timeout_ms(m.timeout_ms)
                .with_transaction_start_time_ms(m.start_ms)
                .with_producer_id(ProducerId(m.producer_id))
                .with_producer_epoch(m.epoch)
                .with_topics(topics),
        );
    }
    DescribeTransactionsResponse::default().with_transaction_states(states)
}

/// ListTransactions (v0-1): the transactional ids this broker coordinates that the
/// principal may describe, filtered by state, producer id and (v1) running for at least
/// `duration_filter` ms. Unknown state names are echoed back, as Kafka does.
pub(super) async fn list(ctx: Request, req: ListTransactionsRequest) -> ListTransactionsResponse {
    const STATES: [&str; 8] = [
        "Empty",
        "Ongoing",
        "PrepareCommit",
        "PrepareAbort",
        "CompleteCommit",
        "CompleteAbort",
        "Dead",
        "PrepareEpochFence",
    ];
    let wanted: Vec<String> = req.state_filters.iter().map(|f| f.to_string()).collect();
    let unknown = wanted
        .iter()
        .filter(|f| !STATES.contains(&f.as_str()))
        .map(|f| s(f.clone()))
        .collect();
    let now = ctx.broker().now_ms();
    let mut states = Vec::new();
    for c in ctx.broker().txns().coordinators() {
        for (id, m) in c.describe().await {
            let state = m.status.name();
            let keep = (wanted.is_empty() || wanted.iter().any(|w| w == state))
                && (req.producer_id_filters.is_empty()
                    || req.producer_id_filters.iter().any(|p| p.0 == m.producer_id))
                && (req.duration_filter < 0
                    || (m.start_ms >= 0 && now.saturating_sub(m.start_ms) >= req.duration_filter))
                && ctx.permits(Operation::Describe, ResourceType::TransactionalId, &id);
            if keep {
                states.push(
                    ListedTxn::default()
                        .with_transactional_id(TransactionalId(s(id)))
                        .with_producer_id(ProducerId(m.producer_id))
                        .with_transaction_state(s(state)),
                );
            }
        }
    }
    ListTransactionsResponse::default()
        .with_unknown_state_filters(unknown)
        .with_transaction_states(states)
}
