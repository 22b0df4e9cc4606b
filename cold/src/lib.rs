pub mod manifest;
pub mod store;
