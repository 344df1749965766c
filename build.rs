//! Compiles `proto/` into Rust with protox (a pure-Rust protobuf compiler), so a fresh machine
//! needs no system `protoc`. Also writes the encoded descriptor set that server reflection serves.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "approvals/v1/types.proto",
    "approvals/v1/agent.proto",
    "approvals/v1/approver.proto",
    "approvals/v1/admin.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler.include_source_info(true).include_imports(true);
    compiler.open_files(PROTOS)?;

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("approvals_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // The contract names an RPC `Connect`, which would collide with the generated
        // `connect` constructor; clients are built from a `Channel` instead.
        .build_transport(false)
        // prost's codec, but a message that does not decode is INVALID_ARGUMENT, not INTERNAL.
        .codec_path("crate::grpc::codec::ProtoCodec")
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
