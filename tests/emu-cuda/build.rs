//! Links the cdylib as `libcuda.so.1` with `-Bsymbolic`, so a preloaded interposer cannot
//! redirect the fake driver's own internal calls (its exports stay interposable for clients).
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
