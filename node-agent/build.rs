//! Generates the kubelet device-plugin API (v1beta1) and the part of its PodResources API (v1)
//! the agent calls from `proto/` with protox (pure Rust, so no `protoc` is needed) and
//! tonic-prost-build. See `proto/ORIGIN.md`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto",
        "proto/k8s.io/kubelet/pkg/apis/podresources/v1/api.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
