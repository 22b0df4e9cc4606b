//! The AWS credential chain behind `s3://` stores: a profile from the shared credentials
//! file is found, and no credentials at all give one clear error. (Its own test binary:
//! it sets process environment variables.)

use object_store::CredentialProvider;
use strata_cold::aws::AwsChain;

#[tokio::test]
async fn credentials_come_from_a_profile_and_their_absence_is_one_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("credentials");
    std::fs::write(
        &creds,
        "[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = x\n\n\
         [settlements]\naws_access_key_id = AKIDPROFILE\naws_secret_access_key = s3cr3t\n\
         aws_session_token = tok\n",
    )
    .unwrap();
    let config = dir.path().join("config");
    std::fs::write(&config, "").unwrap();
    // (This binary's only test: nothing else reads the environment concurrently.)
    {
        for k in [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            "AWS_ROLE_ARN",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        ] {
            std::env::remove_var(k);
        }
        std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
        std::env::set_var("AWS_SHARED_CREDENTIALS_FILE", &creds);
        std::env::set_var("AWS_CONFIG_FILE", &config);
        std::env::set_var("AWS_PROFILE", "settlements");
    }
    let c = AwsChain::default().get_credential().await.unwrap();
    assert_eq!(c.key_id, "AKIDPROFILE");
    assert_eq!(c.secret_key, "s3cr3t");
    assert_eq!(c.token.as_deref(), Some("tok"));

    // No profile file, no env keys, no instance metadata: one line saying what to do.
    {
        std::env::set_var("AWS_SHARED_CREDENTIALS_FILE", dir.path().join("missing"));
        std::env::remove_var("AWS_PROFILE");
    }
    let e = AwsChain::default().get_credential().await.unwrap_err();
    let e = e.to_string();
    assert!(e.contains("no AWS credentials"), "{e}");
    assert!(e.contains("AWS_ACCESS_KEY_ID"), "{e}");
}
