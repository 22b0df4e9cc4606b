//! DescribeClientQuotas and AlterClientQuotas (KIP-546). Quotas live in the metadata log:
//! alterations go to the controllers, descriptions read this broker's copy. Describing takes
//! DescribeConfigs on the cluster, altering takes AlterConfigs, as in Kafka.

use kafka_protocol::messages::alter_client_quotas_response::{
    EntityData as AlteredEntity, EntryData as AlteredEntry,
};
use kafka_protocol::messages::describe_client_quotas_response::{EntityData, EntryData, ValueData};
use kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterClientQuotasResponse, DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
};
use kafka_protocol::protocol::StrBytes;
use strata_controller::metadata::acl::Operation;
use strata_controller::metadata::quota::{
    EntityName, QuotaAlteration, QuotaEntity, QuotaKey, QuotaValue,
};

use super::{codes, s, Request};

const USER: &str = "user";
const CLIENT_ID: &str = "client-id";
/// DescribeClientQuotas match types.
const MATCH_EXACT: i8 = 0;
const MATCH_DEFAULT: i8 = 1;
const MATCH_SPECIFIED: i8 = 2;

/// The part of an entity a component names.
fn part<'a>(e: &'a QuotaEntity, entity_type: &str) -> Result<&'a Option<EntityName>, String> {
    match entity_type {
        USER => Ok(&e.user),
        CLIENT_ID => Ok(&e.client_id),
        other => Err(format!(
            "unknown quota entity type '{other}'; Strata keeps quotas for 'user' and 'client-id'"
        )),
    }
}

fn entity_data(e: &QuotaEntity) -> Vec<(&'static str, Option<StrBytes>)> {
    let name = |n: &EntityName| match n {
        EntityName::Default => None,
        EntityName::Named(n) => Some(s(n)),
    };
    let mut out = Vec::new();
    if let Some(u) = &e.user {
        out.push((USER, name(u)));
    }
    if let Some(c) = &e.client_id {
        out.push((CLIENT_ID, name(c)));
    }
    out
}

pub(super) fn describe(
    ctx: &Request,
    req: DescribeClientQuotasRequest,
) -> DescribeClientQuotasResponse {
    let fail = |code: i16, msg: String| {
        DescribeClientQuotasResponse::default()
            .with_error_code(code)
            .with_error_message(Some(s(&msg)))
            .with_entries(None)
    };
    if !ctx.may_cluster(Operation::DescribeConfigs) {
        return fail(
            codes::CLUSTER_AUTHORIZATION_FAILED,
            format!(
                "{} may not describe client quotas (DescribeConfigs on the cluster)",
                ctx.principal
            ),
        );
    }
    for c in &req.components {
        if let Err(msg) = part(
            &QuotaEntity {
                user: None,
                client_id: None,
            },
            &c.entity_type,
        ) {
            return fail(codes::INVALID_REQUEST, msg);
        }
        if !matches!(c.match_type, MATCH_EXACT | MATCH_DEFAULT | MATCH_SPECIFIED) {
            return fail(
                codes::INVALID_REQUEST,
                format!("unknown match type {}", c.match_type),
            );
        }
    }
    let metadata = ctx
        .broker()
        .cluster()
        .map(|l| l.metadata().borrow().clone());
    let matches = |e: &QuotaEntity| {
        let named_types = e.user.is_some() as usize + e.client_id.is_some() as usize;
        if req.strict && named_types != req.components.len() {
            return false;
        }
        req.components.iter().all(|c| {
            let Ok(p) = part(e, &c.entity_type) else {
                return false;
            };
            match (c.match_type, p) {
                (MATCH_EXACT, Some(EntityName::Named(n))) => {
                    c._match.as_ref().is_some_and(|m| m.as_str() == n)
                }
                (MATCH_EXACT, Some(EntityName::Default)) => c._match.is_none(),
                (MATCH_DEFAULT, Some(EntityName::Default)) => true,
                (MATCH_SPECIFIED, Some(EntityName::Named(_))) => true,
                _ => false,
            }
        })
    };
    let entries = metadata
        .iter()
        .flat_map(|m| m.client_quotas.iter())
        .filter(|(e, _)| matches(e))
        .map(|(e, values)| {
            EntryData::default()
                .with_entity(
                    entity_data(e)
                        .into_iter()
                        .map(|(t, n)| {
                            EntityData::default()
                                .with_entity_type(s(t))
                                .with_entity_name(n)
                        })
                        .collect(),
                )
                .with_values(
                    values
                        .iter()
                        .map(|(k, v)| {
                            ValueData::default()
                                .with_key(s(k.name()))
                                .with_value(v.get())
                        })
                        .collect(),
                )
        })
        .collect();
    DescribeClientQuotasResponse::default()
        .with_error_message(None)
        .with_entries(Some(entries))
}

/// One request entry as an alteration, or why it cannot be one.
fn alteration(
    e: &kafka_protocol::messages::alter_client_quotas_request::EntryData,
) -> Result<QuotaAlteration, String> {
    let mut entity = QuotaEntity {
        user: None,
        client_id: None,
    };
    for c in &e.entity {
        let name = match &c.entity_name {
            None => EntityName::Default,
            Some(n) => EntityName::Named(n.to_string()),
        };
        let slot = match c.entity_type.as_str() {
            USER => &mut entity.user,
            CLIENT_ID => &mut entity.client_id,
            other => {
                return Err(format!(
                    "unknown quota entity type '{other}'; Strata keeps quotas for 'user' and 'client-id'"
                ))
            }
        };
        if slot.replace(name).is_some() {
            return Err(format!("entity type '{}' is named twice", c.entity_type));
        }
    }
    let mut a = QuotaAlteration {
        entity,
        set: Default::default(),
        remove: Vec::new(),
    };
    for op in &e.ops {
        let key = QuotaKey::from_name(op.key.as_str())?;
        if op.remove {
            a.remove.push(key);
        } else {
            a.set.insert(key, QuotaValue::new(op.value)?);
        }
    }
    a.validate()?;
    Ok(a)
}

pub(super) async fn alter(
    ctx: Request,
    req: AlterClientQuotasRequest,
) -> AlterClientQuotasResponse {
    let entity_of = |e: &kafka_protocol::messages::alter_client_quotas_request::EntryData| {
        e.entity
            .iter()
            .map(|c| {
                AlteredEntity::default()
                    .with_entity_type(c.entity_type.clone())
                    .with_entity_name(c.entity_name.clone())
            })
            .collect::<Vec<_>>()
    };
    let answer = |code: i16, msg: Option<String>| {
        req.entries
            .iter()
            .map(|e| {
                AlteredEntry::default()
                    .with_error_code(code)
                    .with_error_message(msg.as_deref().map(s))
                    .with_entity(entity_of(e))
            })
            .collect::<Vec<_>>()
    };
    if !ctx.may_cluster(Operation::AlterConfigs) {
        let msg = format!(
            "{} may not alter client quotas (AlterConfigs on the cluster)",
            ctx.principal
        );
        return AlterClientQuotasResponse::default()
            .with_entries(answer(codes::CLUSTER_AUTHORIZATION_FAILED, Some(msg)));
    }
    let Some(link) = ctx.broker().cluster().cloned() else {
        return AlterClientQuotasResponse::default().with_entries(answer(
            codes::INVALID_REQUEST,
            Some("client quotas need the controllers".into()),
        ));
    };
    let mut results = Vec::with_capacity(req.entries.len());
    let mut valid = Vec::new();
    for e in &req.entries {
        match alteration(e) {
            Ok(a) => {
                valid.push(a);
                results.push(
                    AlteredEntry::default()
                        .with_error_message(None)
                        .with_entity(entity_of(e)),
                );
            }
            Err(msg) => results.push(
                AlteredEntry::default()
                    .with_error_code(codes::INVALID_REQUEST)
                    .with_error_message(Some(s(&msg)))
                    .with_entity(entity_of(e)),
            ),
        }
    }
    if !valid.is_empty() && !req.validate_only {
        if let Err(e) = link.alter_client_quotas(&valid).await {
            let code = if e.code() == tonic::Code::InvalidArgument {
                codes::INVALID_REQUEST
            } else {
                codes::UNKNOWN_SERVER_ERROR
            };
            for r in results.iter_mut().filter(|r| r.error_code == codes::NONE) {
                r.error_code = code;
                r.error_message = Some(s(e.message()));
            }
        } else {
            tracing::info!(principal = %ctx.principal, peer = %ctx.peer, entities = valid.len(), "client quotas altered");
        }
    }
    AlterClientQuotasResponse::default().with_entries(results)
}
