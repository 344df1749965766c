//! The generated `approvals.v1` protobuf types, clients and servers, and the encoded descriptor
//! set that server reflection serves. Nothing but generated code belongs here.

#![allow(clippy::all, missing_docs)]

/// Package `approvals.v1`.
pub mod v1 {
    tonic::include_proto!("approvals.v1");
}

/// The descriptor set of every file under `proto/` (and its imports), for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/approvals_descriptor.bin"));
