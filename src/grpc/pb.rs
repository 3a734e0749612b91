//! The messages and service of `proto/ojs.proto`, generated at build time.

tonic::include_proto!("ojs.v1");

/// The encoded descriptors of the binding's files and their imports, for reflection.
pub const DESCRIPTOR: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/ojs_descriptor.bin"));
