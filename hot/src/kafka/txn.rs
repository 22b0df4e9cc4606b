//! The transaction APIs (KIP-98): InitProducerId with a transactional id,
//! AddPartitionsToTxn (v0-3, the client form), AddOffsetsToTxn and EndTxn, answered by the
//! transaction coordinator of the id ([`crate::txn`]). FindCoordinator for transactional
//! ids and TxnOffsetCommit (answered by the group's coordinator) are in [`super::group`].

use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse, EndTxnRequest, EndTxnResponse, InitProducerIdRequest,
    InitProducerIdResponse, ProducerId,
};
use strata_controller::metadata::acl::{Operation, ResourceType};

use super::{codes, Request};

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
