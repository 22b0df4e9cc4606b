//! The standard gRPC health service (`grpc.health.v1.Health`, what `grpc_health_probe`
//! and Kubernetes' gRPC probes call) on a Strata gRPC port, kept in step with the node's
//! readiness.

use std::time::Duration;

use tokio::sync::watch;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

/// A health service whose overall status ("") starts NOT_SERVING, and its reporter.
pub fn service() -> (
    HealthReporter,
    tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
) {
    tonic_health::server::health_reporter()
}

/// Sets the overall status from `ready` every 500 ms until `stop` turns true, then to
/// NOT_SERVING.
pub async fn report(
    reporter: HealthReporter,
    ready: impl Fn() -> bool + Send + 'static,
    mut stop: watch::Receiver<bool>,
) {
    let mut last = None;
    loop {
        let status = if ready() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        if last != Some(status) {
            reporter.set_service_status("", status).await;
            last = Some(status);
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    reporter
        .set_service_status("", ServingStatus::NotServing)
        .await;
}
