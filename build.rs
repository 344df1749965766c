//! Compiles `proto/` into Rust with protox (a pure-Rust protobuf compiler), so a fresh machine
//! needs no system `protoc`. Also writes the encoded descriptor set that server reflection serves.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "approvals/v1/types.proto",
    "approvals/v1/agent.proto",
    "approvals/v1/approver.proto",
    "approvals/v1/admin.proto",
];

/// The Postgres variants of the tests need a database, named by `APPROVALS_TEST_POSTGRES_URL`.
/// Without it they are compiled as ignored, with the reason, so `cargo test` counts them as not run
/// in its summary ("N ignored") instead of passing them without running. Changing the variable
/// rebuilds, so the cfg always matches the environment `cargo test` runs in.
fn postgres_tests() {
    println!("cargo::rustc-check-cfg=cfg(approvals_test_postgres)");
    println!("cargo:rerun-if-env-changed=APPROVALS_TEST_POSTGRES_URL");
    if std::env::var_os("APPROVALS_TEST_POSTGRES_URL").is_some_and(|url| !url.is_empty()) {
        println!("cargo:rustc-cfg=approvals_test_postgres");
    }
}

/// The commit being built, for the `approvals_build_info` metric: `APPROVALS_GIT_COMMIT` when
/// set (a build from an archive, as in a container), else git's HEAD if this is a checkout.
/// Rebuilds when HEAD moves, so the metric never names an older commit.
fn git_commit() {
    println!("cargo:rerun-if-env-changed=APPROVALS_GIT_COMMIT");
    if std::env::var_os("APPROVALS_GIT_COMMIT").is_some() {
        return;
    }
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .map(|text| text.trim().to_owned())
    };
    let Some(commit) = git(&["rev-parse", "HEAD"]) else {
        return;
    };
    for watched in ["HEAD", "packed-refs"] {
        if let Some(path) = git(&["rev-parse", "--git-path", watched]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"])
        && let Some(path) = git(&["rev-parse", "--git-path", &branch])
    {
        println!("cargo:rerun-if-changed={path}");
    }
    println!("cargo:rustc-env=APPROVALS_GIT_COMMIT={commit}");
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    postgres_tests();
    git_commit();
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
        .codec_path("crate::surface::grpc::codec::ProtoCodec")
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
