//! Links the fake NVML like the real one: soname `libnvidia-ml.so.1`, and `-Bsymbolic` so an
//! interposing library cannot redirect the fake's own internal references.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
}
