//! Whether this process is alive and ready, for `/livez`, `/readyz` and the gRPC health
//! service. It exists from the first moment of `strata server`, before a controller opens
//! its metadata log or a broker recovers its partitions, so a probe is answered (503 and
//! the reason) through a long recovery instead of finding nothing listening.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use crate::broker::Broker;
use crate::config::Role;

/// The roles of one process as they come up.
pub struct Health {
    broker_role: bool,
    controller_role: bool,
    broker: OnceLock<Arc<Broker>>,
    controller: OnceLock<Arc<strata_controller::Controller>>,
    stopping: AtomicBool,
}

impl Health {
    pub fn new(roles: &[Role]) -> Arc<Self> {
        Arc::new(Health {
            broker_role: roles.contains(&Role::Broker),
            controller_role: roles.contains(&Role::Controller),
            broker: OnceLock::new(),
            controller: OnceLock::new(),
            stopping: AtomicBool::new(false),
        })
    }

    /// The broker role has opened its data directory.
    pub fn broker_opened(&self, broker: Arc<Broker>) {
        let _ = self.broker.set(broker);
    }

    /// The controller role has started.
    pub fn controller_started(&self, controller: Arc<strata_controller::Controller>) {
        let _ = self.controller.set(controller);
    }

    /// The process is shutting down: not ready any more, so load balancers drain it.
    pub fn stopping(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    pub fn broker(&self) -> Option<&Arc<Broker>> {
        self.broker.get()
    }

    pub fn controller(&self) -> Option<&Arc<strata_controller::Controller>> {
        self.controller.get()
    }

    /// Ready: every role this process runs serves current data. A broker is ready once it
    /// is registered and unfenced, has applied the metadata it was given, and has no
    /// partition still opening; a controller once it knows the quorum's leader and has
    /// heard from the quorum within an election timeout. Otherwise: why not.
    pub fn readiness(&self) -> Result<(), String> {
        if self.stopping.load(Ordering::Relaxed) {
            return Err("shutting down".into());
        }
        if self.controller_role {
            match self.controller.get() {
                None => return Err("the controller is opening its metadata log".into()),
                Some(c) => c.readiness()?,
            }
        }
        if self.broker_role {
            match self.broker.get() {
                None => {
                    return Err(
                        "the broker is opening its data directory (recovering its logs)".into(),
                    )
                }
                Some(b) => b.readiness()?,
            }
        }
        Ok(())
    }
}
