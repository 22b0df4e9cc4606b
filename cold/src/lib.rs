//! Tiered storage: the object store behind a URL (`store`), the partition manifest with
//! conditional writes (`manifest`) and the uploader of sealed segments (`upload`).

pub mod aws;
mod limit;
pub mod manifest;
pub mod orphans;
pub mod read;
pub mod retention;
pub mod store;
pub mod upload;

#[cfg(test)]
pub(crate) mod testing;

/// The object store crate, so users name the same version.
pub use object_store;
