//! DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554): SCRAM users
//! managed with Kafka's own admin tools. Credentials live in the metadata log; changes go
//! to the controllers, descriptions read this broker's copy and never carry a key.
//! Describing takes Describe on the cluster, changing takes Alter, as in Kafka.
//!
//! A client sends the salted password `Hi(password, salt, i)`, never the password; the
//! broker derives the stored and server keys from it and the salted password goes no
//! further.

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse,
    DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
};
use strata_controller::metadata::acl::Operation;
use strata_controller::metadata::{ScramMechanism, MAX_SCRAM_ITERATIONS, MIN_SCRAM_ITERATIONS};
use strata_proto::v1::{ScramDeletion, ScramUpsertion};

use super::sasl::scram;
use super::{codes, s, Request};

/// Kafka's ScramMechanism codes.
fn mechanism(code: i8) -> Option<ScramMechanism> {
    match code {
        1 => Some(ScramMechanism::Sha256),
        2 => Some(ScramMechanism::Sha512),
        _ => None,
    }
}

fn code(m: ScramMechanism) -> i8 {
    match m {
        ScramMechanism::Sha256 => 1,
        ScramMechanism::Sha512 => 2,
    }
}

pub(super) fn describe(
    ctx: &Request,
    req: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    if !ctx.may_cluster(Operation::Describe) {
        return DescribeUserScramCredentialsResponse::default()
            .with_error_code(codes::CLUSTER_AUTHORIZATION_FAILED)
            .with_error_message(Some(s("describing users takes Describe on the cluster")));
    }
    let Some(metadata) = ctx
        .broker()
        .cluster()
        .map(|l| l.metadata().borrow().clone())
    else {
        return DescribeUserScramCredentialsResponse::default();
    };
    let describe = |user: &str| {
        let result = DescribeUserScramCredentialsResult::default().with_user(s(user));
        match metadata.scram_credentials.get(user) {
            Some(of_user) if !of_user.is_empty() => result.with_credential_infos(
                of_user
                    .iter()
                    .map(|(m, c)| {
                        CredentialInfo::default()
                            .with_mechanism(code(*m))
                            .with_iterations(c.iterations as i32)
                    })
                    .collect(),
            ),
            _ => result
                .with_error_code(codes::RESOURCE_NOT_FOUND)
                .with_error_message(Some(s(format!("user '{user}' has no SCRAM credential")))),
        }
    };
    let results = match req.users.filter(|u| !u.is_empty()) {
        // every user with a credential
        None => metadata
            .scram_credentials
            .iter()
            .filter(|(_, m)| !m.is_empty())
            .map(|(u, _)| describe(u))
            .collect(),
        Some(users) => {
            let mut count: BTreeMap<&str, usize> = BTreeMap::new();
            for u in &users {
                *count.entry(u.name.as_str()).or_default() += 1;
            }
            count
                .into_iter()
                .map(|(u, n)| {
                    if n > 1 {
                        DescribeUserScramCredentialsResult::default()
                            .with_user(s(u))
                            .with_error_code(codes::DUPLICATE_RESOURCE)
                            .with_error_message(Some(s(format!(
                                "user '{u}' is named more than once"
                            ))))
                    } else {
                        describe(u)
                    }
                })
                .collect()
        }
    };
    DescribeUserScramCredentialsResponse::default().with_results(results)
}

/// One user's requested changes, checked: what to send to the controllers, or why not.
#[derive(Default)]
struct UserChanges {
    upsertions: Vec<ScramUpsertion>,
    deletions: Vec<ScramDeletion>,
    error: Option<(i16, String)>,
}

pub(super) async fn alter(
    ctx: Request,
    req: AlterUserScramCredentialsRequest,
) -> AlterUserScramCredentialsResponse {
    let mut users: BTreeMap<String, UserChanges> = BTreeMap::new();
    let mut seen: BTreeSet<(String, i8)> = BTreeSet::new();
    let fail = |changes: &mut UserChanges, code: i16, msg: String| {
        changes.error.get_or_insert((code, msg));
    };
    for d in &req.deletions {
        let user = d.name.to_string();
        let changes = users.entry(user.clone()).or_default();
        if !seen.insert((user.clone(), d.mechanism)) {
            fail(
                changes,
                codes::DUPLICATE_RESOURCE,
                format!("user '{user}' names a mechanism twice"),
            );
        }
        match mechanism(d.mechanism) {
            None => fail(
                changes,
                codes::UNSUPPORTED_SASL_MECHANISM,
                format!("unknown SCRAM mechanism {}", d.mechanism),
            ),
            Some(m) => changes.deletions.push(ScramDeletion {
                user: user.clone(),
                mechanism: m.name().to_string(),
            }),
        }
    }
    for u in &req.upsertions {
        let user = u.name.to_string();
        let changes = users.entry(user.clone()).or_default();
        if !seen.insert((user.clone(), u.mechanism)) {
            fail(
                changes,
                codes::DUPLICATE_RESOURCE,
                format!("user '{user}' names a mechanism twice"),
            );
        }
        let iterations = u32::try_from(u.iterations).unwrap_or(0);
        let m = mechanism(u.mechanism);
        if user.is_empty() {
            fail(
                changes,
                codes::UNACCEPTABLE_CREDENTIAL,
                "the user name is empty".into(),
            );
        } else if !(MIN_SCRAM_ITERATIONS..=MAX_SCRAM_ITERATIONS).contains(&iterations) {
            fail(
                changes,
                codes::UNACCEPTABLE_CREDENTIAL,
                format!(
                    "{} iterations: give {MIN_SCRAM_ITERATIONS} to {MAX_SCRAM_ITERATIONS}",
                    u.iterations
                ),
            );
        } else if u.salt.is_empty() || u.salted_password.is_empty() {
            fail(
                changes,
                codes::UNACCEPTABLE_CREDENTIAL,
                "the salt and salted password must not be empty".into(),
            );
        }
        match m {
            None => fail(
                changes,
                codes::UNSUPPORTED_SASL_MECHANISM,
                format!("unknown SCRAM mechanism {}", u.mechanism),
            ),
            Some(m) => {
                let c = scram::from_salted(m, &u.salted_password, &u.salt, iterations);
                changes.upsertions.push(ScramUpsertion {
                    user: user.clone(),
                    mechanism: m.name().to_string(),
                    salt: c.salt,
                    iterations: c.iterations,
                    stored_key: c.stored_key,
                    server_key: c.server_key,
                });
            }
        }
    }
    let allowed = ctx.may_cluster(Operation::Alter);
    let link = ctx.broker().cluster().cloned();
    let mut results = Vec::with_capacity(users.len());
    for (user, changes) in users {
        let outcome = match (&changes.error, allowed, &link) {
            (_, false, _) => Err((
                codes::CLUSTER_AUTHORIZATION_FAILED,
                format!(
                    "{} may not change users (Alter on the cluster)",
                    ctx.principal
                ),
            )),
            (Some(e), _, _) => Err(e.clone()),
            (None, _, None) => Err((codes::INVALID_REQUEST, "users need the controllers".into())),
            (None, _, Some(link)) => link
                .alter_scram_credentials(changes.upsertions, changes.deletions)
                .await
                .map(|_| ())
                .map_err(|e| match e.code() {
                    tonic::Code::NotFound => (codes::RESOURCE_NOT_FOUND, e.message().to_string()),
                    tonic::Code::InvalidArgument => {
                        (codes::UNACCEPTABLE_CREDENTIAL, e.message().to_string())
                    }
                    _ => (codes::UNKNOWN_SERVER_ERROR, e.message().to_string()),
                }),
        };
        let result = AlterUserScramCredentialsResult::default().with_user(s(&user));
        results.push(match outcome {
            Ok(()) => {
                tracing::info!(principal = %ctx.principal, peer = %ctx.peer, %user, "SCRAM credentials altered");
                result
            }
            Err((code, msg)) => result.with_error_code(code).with_error_message(Some(s(&msg))),
        });
    }
    AlterUserScramCredentialsResponse::default().with_results(results)
}
