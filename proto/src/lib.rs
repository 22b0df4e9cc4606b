//! Strata's gRPC contracts: the `.proto` files under `proto/strata/v1/` and the prost and
//! tonic code generated from them at build time (with protox, so no `protoc` is needed).

#![allow(clippy::large_enum_variant)]

pub mod tls;

pub mod v1 {
    tonic::include_proto!("strata.v1");
}
