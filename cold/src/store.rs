//! Opening the object store from a URL: `file:///abs/dir` (the embedded default, under the
//! data directory), `s3://bucket[/prefix]` for S3 and S3-compatible servers, `memory://`
//! for tests. `object_store` is the only way to the bucket.

use std::sync::Arc;

use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::prefix::PrefixStore;
use object_store::ObjectStore;

/// Where the cold tier lives and how to reach it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreConfig {
    /// `file:///abs/dir`, `s3://bucket[/prefix]` or `memory://`.
    pub url: String,
    /// S3-compatible servers: the endpoint URL (e.g. `http://127.0.0.1:9000`).
    pub endpoint: Option<String>,
    /// Defaults to `AWS_REGION`, else us-east-1.
    pub region: Option<String>,
    /// Path-style requests (`endpoint/bucket/key`), as most S3-compatible servers want.
    pub path_style: bool,
    /// How long one request may take before it fails (`None`: 30 s). With a few quick
    /// retries inside, an unresponsive store fails an upload within about four of these,
    /// and the uploader's own backoff takes over.
    pub request_timeout: Option<std::time::Duration>,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("invalid object store URL '{url}': {why}")]
    BadUrl { url: String, why: String },
    #[error("cannot use the object store at '{url}': {source}")]
    Open {
        url: String,
        source: object_store::Error,
    },
    #[error("cannot create the object store directory {dir}: {source}")]
    Dir { dir: String, source: std::io::Error },
}

/// The store a URL names, ready for use; keys are relative to the URL's path.
pub fn open(config: &StoreConfig) -> Result<Arc<dyn ObjectStore>, StoreError> {
    let url = config.url.trim();
    let bad = |why: &str| StoreError::BadUrl {
        url: url.to_string(),
        why: why.to_string(),
    };
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad("expected file:///abs/dir, s3://bucket[/prefix] or memory://"))?;
    match scheme {
        "memory" => Ok(Arc::new(InMemory::new())),
        "file" => {
            if !rest.starts_with('/') {
                return Err(bad(
                    "a file:// URL needs an absolute path (file:///var/lib/strata/cold)",
                ));
            }
            // The objects are the records: the store's own directory is its owner's alone.
            strata_core::private_fs::create_dir_all(rest).map_err(|source| StoreError::Dir {
                dir: rest.to_string(),
                source,
            })?;
            let fs = LocalFileSystem::new_with_prefix(rest).map_err(|source| StoreError::Open {
                url: url.to_string(),
                source,
            })?;
            Ok(Arc::new(fs))
        }
        "s3" => {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(bad("an s3:// URL names a bucket (s3://bucket/prefix)"));
            }
            // Settings from the environment, then what the config says; credentials from
            // the AWS default chain (env, profile, web identity, ECS, instance metadata).
            let mut b = AmazonS3Builder::from_env()
                .with_credentials(Arc::new(crate::aws::AwsChain::default()))
                .with_bucket_name(bucket)
                .with_conditional_put(S3ConditionalPut::ETagMatch)
                .with_virtual_hosted_style_request(!config.path_style);
            let region = config
                .region
                .clone()
                .or_else(|| std::env::var("AWS_REGION").ok())
                .unwrap_or_else(|| "us-east-1".to_string());
            b = b.with_region(region);
            let timeout = config
                .request_timeout
                .unwrap_or(std::time::Duration::from_secs(30));
            b = b
                .with_client_options(
                    object_store::ClientOptions::new()
                        .with_timeout(timeout)
                        .with_connect_timeout(timeout.min(std::time::Duration::from_secs(5))),
                )
                .with_retry(object_store::RetryConfig {
                    max_retries: 3,
                    retry_timeout: timeout * 4,
                    ..Default::default()
                });
            if let Some(endpoint) = &config.endpoint {
                b = b
                    .with_endpoint(endpoint)
                    .with_allow_http(endpoint.starts_with("http://"));
            }
            let s3 = b.build().map_err(|source| StoreError::Open {
                url: url.to_string(),
                source,
            })?;
            let prefix = prefix.trim_matches('/');
            if prefix.is_empty() {
                Ok(Arc::new(s3))
            } else {
                Ok(Arc::new(PrefixStore::new(s3, prefix)))
            }
        }
        other => Err(bad(&format!(
            "unsupported scheme '{other}'; use file://, s3:// or memory://"
        ))),
    }
}

/// An error and its causes as one line, for the command-line tools: a cause its parent
/// already quotes is left out, and an S3 error's XML body becomes its code and message
/// (`NoSuchBucket: The specified bucket does not exist`).
pub fn error_line<'a>(
    chain: impl IntoIterator<Item = &'a (dyn std::error::Error + 'static)>,
) -> String {
    let mut out = String::new();
    for cause in chain {
        let s = cause.to_string();
        if out.contains(&s) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&s);
    }
    if let Some(at) = out.find("<?xml") {
        let tag = |name: &str| {
            let open = format!("<{name}>");
            let start = out[at..].find(&open)? + at + open.len();
            let end = out[start..].find(&format!("</{name}>"))? + start;
            Some(out[start..end].to_string())
        };
        if let (Some(code), Some(message)) = (tag("Code"), tag("Message")) {
            let hint = match code.as_str() {
                "NoSuchBucket" => " (check the bucket in the URL)",
                "AccessDenied" | "InvalidAccessKeyId" | "SignatureDoesNotMatch" => {
                    " (check the AWS credentials and the bucket policy)"
                }
                _ => "",
            };
            out = format!("{}{code}: {message}{hint}", &out[..at]);
        }
    }
    out.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(url: &str) -> StoreConfig {
        StoreConfig {
            url: url.to_string(),
            ..StoreConfig::default()
        }
    }

    #[test]
    fn urls_are_checked_with_a_clear_error() {
        for (url, says) in [
            ("cold", "expected file:///abs/dir"),
            ("file://relative/dir", "absolute path"),
            ("s3://", "names a bucket"),
            ("gs://bucket", "unsupported scheme 'gs'"),
        ] {
            let e = open(&cfg(url)).expect_err(url).to_string();
            assert!(e.contains(says), "{url}: {e}");
        }
    }

    #[tokio::test]
    async fn file_and_memory_stores_open_and_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}/cold", dir.path().display());
        for store in [open(&cfg(&url)).unwrap(), open(&cfg("memory://")).unwrap()] {
            let path = object_store::path::Path::from("a/b");
            store
                .put(&path, bytes::Bytes::from_static(b"x").into())
                .await
                .unwrap();
            let got = store.get(&path).await.unwrap().bytes().await.unwrap();
            assert_eq!(&got[..], b"x");
        }
        assert!(dir.path().join("cold/a/b").exists());
    }

    #[test]
    fn s3_urls_build_with_a_prefix_and_an_endpoint() {
        let store = open(&StoreConfig {
            url: "s3://bucket/cluster-a".into(),
            endpoint: Some("http://127.0.0.1:9000".into()),
            region: Some("eu-west-1".into()),
            path_style: true,
            request_timeout: None,
        })
        .unwrap();
        assert!(store.to_string().contains("cluster-a"), "{store}");
    }

    #[test]
    fn errors_read_as_one_line_with_the_s3_code() {
        let e = std::io::Error::other(
            "GET http://h/b failed: 404 Not Found: <?xml version=\"1.0\"?>\n<Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message><RequestId>x</RequestId></Error>",
        );
        let line = error_line([&e as &(dyn std::error::Error + 'static)]);
        assert_eq!(
            line,
            "GET http://h/b failed: 404 Not Found: NoSuchBucket: The specified bucket does not exist (check the bucket in the URL)"
        );
    }
}
