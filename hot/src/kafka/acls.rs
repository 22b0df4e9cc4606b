//! DescribeAcls, CreateAcls and DeleteAcls (KIP-140, patterns from KIP-290). Bindings live
//! in the metadata log: creations and deletions go to the controllers, descriptions read
//! this broker's copy. Describing takes Describe on the cluster, changing takes Alter.

use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::{
    DeleteAclsFilterResult, DeleteAclsMatchingAcl,
};
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::{
    CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse,
    DescribeAclsRequest, DescribeAclsResponse,
};
use kafka_protocol::protocol::StrBytes;
use strata_controller::metadata::acl::{
    AclBinding, AclFilter, Operation, PatternType, Permission, ResourceType,
};

use super::{codes, s, Request};

const ANY: i8 = 1;
const MATCH: i8 = 2;

fn pattern_from_code(code: i8) -> Option<PatternType> {
    [PatternType::Literal, PatternType::Prefixed]
        .into_iter()
        .find(|p| p.code() == code)
}

fn permission_from_code(code: i8) -> Option<Permission> {
    [Permission::Deny, Permission::Allow]
        .into_iter()
        .find(|p| p.code() == code)
}

/// A filter's field: `ANY` is None; anything else must be a known code.
fn field<T>(code: i8, parse: impl Fn(i8) -> Option<T>, what: &str) -> Result<Option<T>, String> {
    if code == ANY {
        return Ok(None);
    }
    parse(code)
        .map(Some)
        .ok_or_else(|| format!("unknown {what} code {code}"))
}

#[allow(clippy::too_many_arguments)]
fn filter(
    resource_type: i8,
    name: Option<&StrBytes>,
    pattern: i8,
    principal: Option<&StrBytes>,
    host: Option<&StrBytes>,
    operation: i8,
    permission: i8,
) -> Result<AclFilter, String> {
    // MATCH: every binding that applies to the named resource (any pattern type)
    let matching = pattern == MATCH;
    Ok(AclFilter {
        resource_type: field(resource_type, ResourceType::from_code, "resource type")?,
        name: name.map(|n| n.to_string()),
        pattern: if matching {
            None
        } else {
            field(pattern, pattern_from_code, "pattern type")?
        },
        matching,
        principal: principal.map(|p| p.to_string()),
        host: host.map(|h| h.to_string()),
        operation: field(operation, Operation::from_code, "operation")?,
        permission: field(permission, permission_from_code, "permission type")?,
    })
}

pub(super) async fn create_acls(ctx: Request, req: CreateAclsRequest) -> CreateAclsResponse {
    let fail_all = |code: i16, msg: String| {
        CreateAclsResponse::default().with_results(
            req.creations
                .iter()
                .map(|_| {
                    AclCreationResult::default()
                        .with_error_code(code)
                        .with_error_message(Some(s(&msg)))
                })
                .collect(),
        )
    };
    if !ctx.may_cluster(Operation::Alter) {
        return fail_all(
            codes::CLUSTER_AUTHORIZATION_FAILED,
            format!(
                "{} may not change ACLs (Alter on the cluster)",
                ctx.principal
            ),
        );
    }
    let Some(link) = ctx.broker().cluster().cloned() else {
        return fail_all(codes::INVALID_REQUEST, "ACLs need the controllers".into());
    };
    let mut results = Vec::with_capacity(req.creations.len());
    let mut valid = Vec::new();
    for c in &req.creations {
        let binding = (|| {
            let resource_type = ResourceType::from_code(c.resource_type)
                .ok_or_else(|| format!("unknown resource type code {}", c.resource_type))?;
            let pattern = pattern_from_code(c.resource_pattern_type).ok_or_else(|| {
                format!(
                    "pattern type code {} is not LITERAL or PREFIXED",
                    c.resource_pattern_type
                )
            })?;
            let binding = AclBinding {
                resource_type,
                name: c.resource_name.to_string(),
                pattern,
                principal: c.principal.to_string(),
                host: c.host.to_string(),
                operation: Operation::from_code(c.operation)
                    .ok_or_else(|| format!("unknown operation code {}", c.operation))?,
                permission: permission_from_code(c.permission_type)
                    .ok_or_else(|| format!("unknown permission code {}", c.permission_type))?,
            };
            binding.validate()?;
            Ok::<_, String>(binding)
        })();
        match binding {
            Ok(b) => {
                valid.push(b);
                results.push(AclCreationResult::default());
            }
            Err(msg) => results.push(
                AclCreationResult::default()
                    .with_error_code(codes::INVALID_REQUEST)
                    .with_error_message(Some(s(&msg))),
            ),
        }
    }
    if !valid.is_empty() {
        if let Err(e) = link.create_acls(&valid).await {
            let (code, msg) = (codes::UNKNOWN_SERVER_ERROR, e.message().to_string());
            for r in results.iter_mut().filter(|r| r.error_code == codes::NONE) {
                *r = AclCreationResult::default()
                    .with_error_code(code)
                    .with_error_message(Some(s(&msg)));
            }
        }
    }
    tracing::info!(principal = %ctx.principal, peer = %ctx.peer, created = valid.len(), "CreateAcls");
    CreateAclsResponse::default().with_results(results)
}

pub(super) fn describe_acls(ctx: &Request, req: DescribeAclsRequest) -> DescribeAclsResponse {
    if !ctx.may_cluster(Operation::Describe) {
        return DescribeAclsResponse::default()
            .with_error_code(codes::CLUSTER_AUTHORIZATION_FAILED)
            .with_error_message(Some(s("describing ACLs takes Describe on the cluster")));
    }
    let f = match filter(
        req.resource_type_filter,
        req.resource_name_filter.as_ref(),
        req.pattern_type_filter,
        req.principal_filter.as_ref(),
        req.host_filter.as_ref(),
        req.operation,
        req.permission_type,
    ) {
        Ok(f) => f,
        Err(msg) => {
            return DescribeAclsResponse::default()
                .with_error_code(codes::INVALID_REQUEST)
                .with_error_message(Some(s(&msg)))
        }
    };
    let metadata = ctx
        .broker()
        .cluster()
        .map(|l| l.metadata().borrow().clone());
    let mut resources: Vec<DescribeAclsResource> = Vec::new();
    for a in metadata
        .iter()
        .flat_map(|m| m.acls.iter())
        .filter(|a| f.matches(a))
    {
        let d = AclDescription::default()
            .with_principal(s(&a.principal))
            .with_host(s(&a.host))
            .with_operation(a.operation.code())
            .with_permission_type(a.permission.code());
        // bindings are sorted by resource, so one resource's bindings are adjacent
        match resources.last_mut() {
            Some(r)
                if r.resource_type == a.resource_type.code()
                    && r.resource_name.as_str() == a.name
                    && r.pattern_type == a.pattern.code() =>
            {
                r.acls.push(d)
            }
            _ => resources.push(
                DescribeAclsResource::default()
                    .with_resource_type(a.resource_type.code())
                    .with_resource_name(s(&a.name))
                    .with_pattern_type(a.pattern.code())
                    .with_acls(vec![d]),
            ),
        }
    }
    DescribeAclsResponse::default().with_resources(resources)
}

pub(super) async fn delete_acls(ctx: Request, req: DeleteAclsRequest) -> DeleteAclsResponse {
    let fail_all = |code: i16, msg: &str| {
        DeleteAclsResponse::default().with_filter_results(
            req.filters
                .iter()
                .map(|_| {
                    DeleteAclsFilterResult::default()
                        .with_error_code(code)
                        .with_error_message(Some(s(msg)))
                })
                .collect(),
        )
    };
    if !ctx.may_cluster(Operation::Alter) {
        return fail_all(
            codes::CLUSTER_AUTHORIZATION_FAILED,
            "changing ACLs takes Alter on the cluster",
        );
    }
    let Some(link) = ctx.broker().cluster().cloned() else {
        return fail_all(codes::INVALID_REQUEST, "ACLs need the controllers");
    };
    let mut parsed = Vec::with_capacity(req.filters.len());
    for f in &req.filters {
        match filter(
            f.resource_type_filter,
            f.resource_name_filter.as_ref(),
            f.pattern_type_filter,
            f.principal_filter.as_ref(),
            f.host_filter.as_ref(),
            f.operation,
            f.permission_type,
        ) {
            Ok(f) => parsed.push(f),
            Err(msg) => return fail_all(codes::INVALID_REQUEST, &msg),
        }
    }
    let deleted = match link.delete_acls(&parsed).await {
        Ok(d) => d,
        Err(e) => return fail_all(codes::UNKNOWN_SERVER_ERROR, e.message()),
    };
    tracing::info!(principal = %ctx.principal, peer = %ctx.peer, deleted = deleted.len(), "DeleteAcls");
    let results = parsed
        .iter()
        .map(|f| {
            DeleteAclsFilterResult::default().with_matching_acls(
                deleted
                    .iter()
                    .filter(|a| f.matches(a))
                    .map(|a| {
                        DeleteAclsMatchingAcl::default()
                            .with_resource_type(a.resource_type.code())
                            .with_resource_name(s(&a.name))
                            .with_pattern_type(a.pattern.code())
                            .with_principal(s(&a.principal))
                            .with_host(s(&a.host))
                            .with_operation(a.operation.code())
                            .with_permission_type(a.permission.code())
                    })
                    .collect(),
            )
        })
        .collect();
    DeleteAclsResponse::default().with_filter_results(results)
}
