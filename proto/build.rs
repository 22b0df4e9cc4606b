//! Compiles `proto/strata/v1/*.proto` with protox (pure Rust, no protoc) and generates the
//! prost messages and tonic clients and servers.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/strata/v1/broker.proto",
        "proto/strata/v1/controller.proto",
        "proto/strata/v1/raft.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        // Replicated records go from the socket to the log without a copy.
        .bytes(".strata.v1.ReplicaFetchResponse.records")
        .compile_fds(fds)?;
    Ok(())
}
