//! Tiered storage: the object store behind a URL (`store`) with AWS credentials (`aws`),
//! the bucket's topic descriptions (`catalog`), the partition manifest with conditional
//! writes (`manifest`), the uploader of sealed segments (`upload`), the remote reader
//! (`read`), remote retention (`retention`) and orphan clean-up (`orphans`).

pub mod aws;
pub mod catalog;
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
