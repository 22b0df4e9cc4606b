//! S3 credentials from the AWS default chain (aws-config): environment variables, the
//! shared config and credentials files (`AWS_PROFILE`), web identity (EKS service
//! accounts), the ECS container endpoint and EC2 instance metadata. Credentials are cached
//! and refreshed five minutes before they expire.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_credential_types::provider::ProvideCredentials;
use object_store::aws::AwsCredential;
use object_store::CredentialProvider;
use tokio::sync::{Mutex, OnceCell};

/// Refresh this long before the credentials expire.
const REFRESH_BEFORE: Duration = Duration::from_secs(300);

/// An `object_store` credential provider backed by aws-config's default chain, built on
/// first use (it needs the runtime).
#[derive(Debug, Default)]
pub struct AwsChain {
    chain: OnceCell<aws_credential_types::provider::SharedCredentialsProvider>,
    cached: Mutex<Option<(Arc<AwsCredential>, Option<SystemTime>)>>,
}

impl AwsChain {
    async fn chain(&self) -> &aws_credential_types::provider::SharedCredentialsProvider {
        self.chain
            .get_or_init(|| async {
                let chain =
                    aws_config::default_provider::credentials::DefaultCredentialsChain::builder()
                        .build()
                        .await;
                aws_credential_types::provider::SharedCredentialsProvider::new(chain)
            })
            .await
    }
}

#[async_trait::async_trait]
impl CredentialProvider for AwsChain {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        let mut cached = self.cached.lock().await;
        if let Some((c, expiry)) = cached.as_ref() {
            let fresh = expiry.is_none_or(|e| SystemTime::now() + REFRESH_BEFORE < e);
            if fresh {
                return Ok(c.clone());
            }
        }
        let got = self
            .chain()
            .await
            .provide_credentials()
            .await
            .map_err(|e| object_store::Error::Generic {
                store: "S3",
                source: format!(
                    "no AWS credentials ({}): set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, \
                     a profile (AWS_PROFILE), web identity, or run with an instance role",
                    aws_smithy_error(&e)
                )
                .into(),
            })?;
        let c = Arc::new(AwsCredential {
            key_id: got.access_key_id().to_string(),
            secret_key: got.secret_access_key().to_string(),
            token: got.session_token().map(str::to_string),
        });
        *cached = Some((c.clone(), got.expiry()));
        Ok(c)
    }
}

/// The error with its causes, on one line.
fn aws_smithy_error(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    // The chain lists what it tried over several lines: one line suits a log or a CLI.
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}
