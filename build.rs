//! Compiles the gRPC binding's protobuf definitions (`src/grpc/proto/`) into Rust, with a
//! pure-Rust parser so that building needs no `protoc`, and keeps their encoded descriptors
//! (imports included) for the reflection service.

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=src/grpc/proto");
    let mut compiler = protox::Compiler::new(["src/grpc/proto"])?;
    compiler.include_imports(true);
    compiler.open_file("ojs.proto")?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("ojs_descriptor.bin"),
        compiler.file_descriptor_set().encode_to_vec(),
    )?;
    let own = protox::compile(["ojs.proto"], ["src/grpc/proto"])?;
    tonic_prost_build::configure().compile_fds(own)?;
    Ok(())
}
