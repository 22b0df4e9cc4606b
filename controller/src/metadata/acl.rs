//! Access control lists with Kafka's model (KIP-290 patterns): who (principal, host) may do
//! what (operation) to which resource (topic, group, cluster, transactional id, by literal or
//! prefixed name), allowed or denied. Pure logic: bindings in, a decision out. Stored in the
//! metadata log like any metadata, so every broker decides the same way.
//!
//! Kafka's rules, kept exactly:
//! - a super user may do anything;
//! - a matching DENY wins over any ALLOW;
//! - an ALLOW of Read, Write, Delete or Alter also allows Describe, and an ALLOW of
//!   AlterConfigs also allows DescribeConfigs; `All` matches every operation;
//! - principal `User:*` and host `*` match everyone; the literal resource name `*` matches
//!   every resource of its type;
//! - a resource that no binding names at all is allowed only when
//!   `allow.everyone.if.no.acl.found` is set.

use serde::{Deserialize, Serialize};

/// Kafka's resource types (their numbers are Kafka's `ResourceType` codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ResourceType {
    Topic,
    Group,
    Cluster,
    TransactionalId,
}

impl ResourceType {
    pub fn code(self) -> i8 {
        match self {
            ResourceType::Topic => 2,
            ResourceType::Group => 3,
            ResourceType::Cluster => 4,
            ResourceType::TransactionalId => 5,
        }
    }

    pub fn from_code(code: i8) -> Option<ResourceType> {
        [
            ResourceType::Topic,
            ResourceType::Group,
            ResourceType::Cluster,
            ResourceType::TransactionalId,
        ]
        .into_iter()
        .find(|r| r.code() == code)
    }
}

/// How a binding's resource name matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PatternType {
    /// The exact name, or `*` for every resource of the type.
    Literal,
    /// Every name that starts with it.
    Prefixed,
}

impl PatternType {
    pub fn code(self) -> i8 {
        match self {
            PatternType::Literal => 3,
            PatternType::Prefixed => 4,
        }
    }
}

/// Kafka's ACL operations (their numbers are Kafka's `AclOperation` codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Operation {
    All,
    Read,
    Write,
    Create,
    Delete,
    Alter,
    Describe,
    ClusterAction,
    DescribeConfigs,
    AlterConfigs,
    IdempotentWrite,
}

impl Operation {
    pub const EVERY: [Operation; 11] = [
        Operation::All,
        Operation::Read,
        Operation::Write,
        Operation::Create,
        Operation::Delete,
        Operation::Alter,
        Operation::Describe,
        Operation::ClusterAction,
        Operation::DescribeConfigs,
        Operation::AlterConfigs,
        Operation::IdempotentWrite,
    ];

    pub fn code(self) -> i8 {
        match self {
            Operation::All => 2,
            Operation::Read => 3,
            Operation::Write => 4,
            Operation::Create => 5,
            Operation::Delete => 6,
            Operation::Alter => 7,
            Operation::Describe => 8,
            Operation::ClusterAction => 9,
            Operation::DescribeConfigs => 10,
            Operation::AlterConfigs => 11,
            Operation::IdempotentWrite => 12,
        }
    }

    pub fn from_code(code: i8) -> Option<Operation> {
        Self::EVERY.into_iter().find(|o| o.code() == code)
    }

    /// The operations whose ALLOW also allows this one.
    fn allowed_by(self) -> &'static [Operation] {
        use Operation::*;
        match self {
            Describe => &[All, Describe, Read, Write, Delete, Alter],
            DescribeConfigs => &[All, DescribeConfigs, AlterConfigs],
            Read => &[All, Read],
            Write => &[All, Write],
            Create => &[All, Create],
            Delete => &[All, Delete],
            Alter => &[All, Alter],
            ClusterAction => &[All, ClusterAction],
            AlterConfigs => &[All, AlterConfigs],
            IdempotentWrite => &[All, IdempotentWrite],
            All => &[All],
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Permission {
    Deny,
    Allow,
}

impl Permission {
    pub fn code(self) -> i8 {
        match self {
            Permission::Deny => 2,
            Permission::Allow => 3,
        }
    }
}

/// One ACL: `principal` from `host` is allowed (or denied) `operation` on the resources
/// `resource_type` / `name` matches by `pattern`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AclBinding {
    pub resource_type: ResourceType,
    pub name: String,
    pub pattern: PatternType,
    /// `User:alice`, `User:CN=svc,O=Funds`, or `User:*`.
    pub principal: String,
    /// A client address, or `*`.
    pub host: String,
    pub operation: Operation,
    pub permission: Permission,
}

/// Everyone: as a principal (`User:*`), a host, or a literal resource name.
pub const WILDCARD: &str = "*";
pub const WILDCARD_PRINCIPAL: &str = "User:*";

impl AclBinding {
    fn names(&self, resource_type: ResourceType, name: &str) -> bool {
        self.resource_type == resource_type
            && match self.pattern {
                PatternType::Literal => self.name == name || self.name == WILDCARD,
                PatternType::Prefixed => name.starts_with(&self.name),
            }
    }

    fn applies_to(&self, principal: &str, host: &str) -> bool {
        (self.principal == principal || self.principal == WILDCARD_PRINCIPAL)
            && (self.host == host || self.host == WILDCARD)
    }

    /// Checks what every replica must accept the same way.
    pub fn validate(&self) -> Result<(), String> {
        if self.name.is_empty() {
            return Err("the resource name is empty".into());
        }
        if self.resource_type == ResourceType::Cluster
            && (self.name != "kafka-cluster" || self.pattern != PatternType::Literal)
        {
            return Err("the cluster resource is the literal name 'kafka-cluster'".into());
        }
        if self.pattern == PatternType::Prefixed && self.name == WILDCARD {
            return Err("a prefixed pattern cannot be '*' (use a literal '*')".into());
        }
        match self.principal.split_once(':') {
            Some((kind, name)) if !kind.is_empty() && !name.is_empty() => {}
            _ => {
                return Err(format!(
                    "principal '{}' is not of the form Type:name (e.g. User:alice)",
                    self.principal
                ))
            }
        }
        if self.host.is_empty() {
            return Err("the host is empty (use '*' for any host)".into());
        }
        Ok(())
    }
}

/// The cluster resource's one name, as Kafka spells it.
pub const CLUSTER_NAME: &str = "kafka-cluster";

/// How bindings are applied: Kafka's `super.users` and `allow.everyone.if.no.acl.found`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthorizerConfig {
    pub super_users: Vec<String>,
    pub allow_if_no_acl: bool,
}

impl AuthorizerConfig {
    /// No super users, and every resource no ACL names is open (a cluster without
    /// authentication).
    pub fn open() -> AuthorizerConfig {
        AuthorizerConfig {
            super_users: Vec::new(),
            allow_if_no_acl: true,
        }
    }
}

/// Whether `principal` from `host` may do `operation` on the resource.
pub fn authorize<'a>(
    acls: impl IntoIterator<Item = &'a AclBinding>,
    config: &AuthorizerConfig,
    principal: &str,
    host: &str,
    operation: Operation,
    resource_type: ResourceType,
    name: &str,
) -> bool {
    if config.super_users.iter().any(|s| s == principal) {
        return true;
    }
    let mut named = false;
    let mut allowed = false;
    for acl in acls {
        if !acl.names(resource_type, name) {
            continue;
        }
        named = true;
        if !acl.applies_to(principal, host) {
            continue;
        }
        match acl.permission {
            Permission::Deny if acl.operation == operation || acl.operation == Operation::All => {
                return false;
            }
            Permission::Allow if operation.allowed_by().contains(&acl.operation) => {
                allowed = true;
            }
            _ => {}
        }
    }
    allowed || (!named && config.allow_if_no_acl)
}

/// A filter over bindings (DescribeAcls, DeleteAcls): `None` matches anything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclFilter {
    pub resource_type: Option<ResourceType>,
    pub name: Option<String>,
    /// `None`: any pattern (Kafka's ANY, or MATCH with `matching`).
    pub pattern: Option<PatternType>,
    /// Kafka's MATCH: `name` is a resource, and the filter takes the bindings that would
    /// apply to it (a literal of that name or `*`, a prefix of it), not just those named so.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub matching: bool,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: Option<Operation>,
    pub permission: Option<Permission>,
}

impl AclFilter {
    pub fn matches(&self, acl: &AclBinding) -> bool {
        let name = |n: &String| match (self.matching, acl.pattern) {
            (false, _) => *n == acl.name,
            (true, PatternType::Literal) => *n == acl.name || acl.name == WILDCARD,
            (true, PatternType::Prefixed) => n.starts_with(&acl.name),
        };
        self.resource_type.is_none_or(|r| r == acl.resource_type)
            && self.name.as_ref().is_none_or(name)
            && self.pattern.is_none_or(|p| p == acl.pattern)
            && self.principal.as_ref().is_none_or(|p| *p == acl.principal)
            && self.host.as_ref().is_none_or(|h| *h == acl.host)
            && self.operation.is_none_or(|o| o == acl.operation)
            && self.permission.is_none_or(|p| p == acl.permission)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(
        resource_type: ResourceType,
        name: &str,
        pattern: PatternType,
        principal: &str,
        operation: Operation,
        permission: Permission,
    ) -> AclBinding {
        AclBinding {
            resource_type,
            name: name.into(),
            pattern,
            principal: principal.into(),
            host: WILDCARD.into(),
            operation,
            permission,
        }
    }

    use Operation::*;
    use PatternType::*;
    use Permission::*;
    use ResourceType::*;

    /// The settlement profile of issue 15: the order service may write `mf.settlement.*`
    /// and nothing else; the audit team may read everything and write nothing; only the
    /// operator may alter, change configs or delete.
    fn settlement_profile() -> Vec<AclBinding> {
        vec![
            acl(
                Topic,
                "mf.settlement.",
                Prefixed,
                "User:orders",
                Write,
                Allow,
            ),
            acl(
                Cluster,
                CLUSTER_NAME,
                Literal,
                "User:orders",
                IdempotentWrite,
                Allow,
            ),
            acl(Topic, "*", Literal, "User:audit", Read, Allow),
            acl(Group, "audit-", Prefixed, "User:audit", Read, Allow),
            acl(Topic, "*", Literal, "User:audit", Write, Deny),
            acl(Topic, "*", Literal, "User:ops", All, Allow),
            acl(Cluster, CLUSTER_NAME, Literal, "User:ops", All, Allow),
        ]
    }

    fn may(acls: &[AclBinding], who: &str, op: Operation, rt: ResourceType, name: &str) -> bool {
        authorize(
            acls,
            &AuthorizerConfig::default(),
            who,
            "10.0.0.1",
            op,
            rt,
            name,
        )
    }

    #[test]
    fn the_settlement_profile_limits_each_credential_to_its_blast_radius() {
        let p = settlement_profile();
        assert!(may(&p, "User:orders", Write, Topic, "mf.settlement.trades"));
        assert!(
            may(&p, "User:orders", Describe, Topic, "mf.settlement.trades"),
            "Write implies Describe"
        );
        assert!(!may(&p, "User:orders", Write, Topic, "clickstream"));
        assert!(!may(&p, "User:orders", Read, Topic, "mf.settlement.trades"));
        for op in [Alter, AlterConfigs, Delete, Create] {
            assert!(
                !may(&p, "User:orders", op, Topic, "mf.settlement.trades"),
                "{op:?}"
            );
        }
        assert!(may(
            &p,
            "User:orders",
            IdempotentWrite,
            Cluster,
            CLUSTER_NAME
        ));
        assert!(may(&p, "User:audit", Read, Topic, "mf.settlement.trades"));
        assert!(may(&p, "User:audit", Read, Topic, "clickstream"));
        assert!(!may(&p, "User:audit", Write, Topic, "mf.settlement.trades"));
        assert!(may(&p, "User:audit", Read, Group, "audit-nightly"));
        assert!(!may(&p, "User:audit", Read, Group, "orders-app"));
        for op in [Alter, AlterConfigs, Delete, Write, Read] {
            assert!(
                may(&p, "User:ops", op, Topic, "mf.settlement.trades"),
                "{op:?}"
            );
        }
        assert!(!may(
            &p,
            "User:ANONYMOUS",
            Describe,
            Topic,
            "mf.settlement.trades"
        ));
    }

    #[test]
    fn deny_wins_and_implications_follow_kafka() {
        let p = vec![
            acl(Topic, "t", Literal, "User:*", All, Allow),
            acl(Topic, "t", Literal, "User:eve", Read, Deny),
        ];
        assert!(may(&p, "User:bob", Read, Topic, "t"));
        assert!(!may(&p, "User:eve", Read, Topic, "t"));
        assert!(
            may(&p, "User:eve", Write, Topic, "t"),
            "the deny is for Read only"
        );
        let p = vec![acl(Topic, "t", Literal, "User:a", AlterConfigs, Allow)];
        assert!(may(&p, "User:a", DescribeConfigs, Topic, "t"));
        assert!(
            !may(&p, "User:a", Describe, Topic, "t"),
            "AlterConfigs does not imply Describe"
        );
        let p = vec![acl(Topic, "t", Literal, "User:a", Describe, Allow)];
        assert!(
            !may(&p, "User:a", Read, Topic, "t"),
            "Describe implies nothing"
        );
    }

    #[test]
    fn hosts_super_users_and_resources_without_acls() {
        let mut p = vec![acl(Topic, "t", Literal, "User:a", Read, Allow)];
        p[0].host = "10.0.0.9".into();
        assert!(!may(&p, "User:a", Read, Topic, "t"), "another host");
        let open = AuthorizerConfig {
            super_users: vec!["User:root".into()],
            allow_if_no_acl: true,
        };
        assert!(authorize(&p, &open, "User:a", "10.0.0.9", Read, Topic, "t"));
        assert!(
            authorize(&p, &open, "User:root", "h", Delete, Topic, "t"),
            "super user"
        );
        assert!(
            authorize(&p, &open, "User:x", "h", Delete, Topic, "other"),
            "no ACL names it"
        );
        assert!(
            !authorize(&p, &open, "User:x", "h", Read, Topic, "t"),
            "t has ACLs, none for x"
        );
        assert!(
            !may(&p, "User:x", Delete, Topic, "other"),
            "closed by default"
        );
    }

    #[test]
    fn prefixes_and_wildcards_match_only_their_type() {
        let p = vec![acl(Topic, "mf.", Prefixed, "User:a", Read, Allow)];
        assert!(may(&p, "User:a", Read, Topic, "mf.x"));
        assert!(!may(&p, "User:a", Read, Topic, "mfx"));
        assert!(
            !may(&p, "User:a", Read, Group, "mf.x"),
            "a topic ACL says nothing of groups"
        );
        let p = vec![acl(Topic, "mf.", Literal, "User:a", Read, Allow)];
        assert!(!may(&p, "User:a", Read, Topic, "mf.x"), "literal is exact");
    }

    #[test]
    fn bindings_are_validated_and_filters_match_fields() {
        let good = acl(Topic, "t", Literal, "User:a", Read, Allow);
        assert!(good.validate().is_ok());
        for bad in [
            AclBinding {
                name: String::new(),
                ..good.clone()
            },
            AclBinding {
                principal: "alice".into(),
                ..good.clone()
            },
            AclBinding {
                host: String::new(),
                ..good.clone()
            },
            AclBinding {
                pattern: Prefixed,
                name: "*".into(),
                ..good.clone()
            },
            AclBinding {
                resource_type: Cluster,
                name: "c".into(),
                ..good.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        let f = AclFilter {
            principal: Some("User:a".into()),
            ..AclFilter::default()
        };
        assert!(f.matches(&good));
        assert!(!AclFilter {
            operation: Some(Write),
            ..f.clone()
        }
        .matches(&good));
        assert!(AclFilter::default().matches(&good));
    }

    /// Kafka's MATCH filter (librdkafka's 0081 DescribeAcls): the bindings that apply to a
    /// resource: its literal name, the `*` literal and every prefix of it, not other names.
    #[test]
    fn a_match_filter_takes_the_bindings_that_apply_to_the_resource() {
        let binding = |name: &str, pattern| acl(Topic, name, pattern, "User:a", Read, Allow);
        let f = AclFilter {
            resource_type: Some(Topic),
            name: Some("mf.settlement.trades".into()),
            matching: true,
            ..AclFilter::default()
        };
        for (b, applies) in [
            (binding("mf.settlement.trades", Literal), true),
            (binding("*", Literal), true),
            (binding("mf.settlement.", Prefixed), true),
            (binding("mf.settlement.trades", Prefixed), true),
            (binding("mf.settlement.trades.eu", Prefixed), false),
            (binding("mf.settlement", Literal), false),
            (binding("clicks", Literal), false),
        ] {
            assert_eq!(f.matches(&b), applies, "{b:?}");
        }
        // without MATCH the name is compared as it is
        let exact = AclFilter {
            matching: false,
            ..f.clone()
        };
        assert!(!exact.matches(&binding("*", Literal)));
    }

    #[test]
    fn operation_codes_round_trip() {
        for op in Operation::EVERY {
            assert_eq!(Operation::from_code(op.code()), Some(op));
        }
        for rt in [Topic, Group, Cluster, TransactionalId] {
            assert_eq!(ResourceType::from_code(rt.code()), Some(rt));
        }
    }
}
