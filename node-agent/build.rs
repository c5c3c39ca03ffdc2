//! Generates the kubelet device-plugin API (v1beta1) from the vendored proto with protox
//! (pure Rust, so no `protoc` is needed) and tonic-prost-build. See `proto/ORIGIN.md`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
