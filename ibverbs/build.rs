//! Links `libxwarp_ibverbs.so` with `libxwarp_ibverbs.map`, the linker version script that
//! gives every exported function the symbol version Debian's libibverbs.so.1 defines it at
//! (the dynamic linker matches `ibv_open_device@IBVERBS_1.1`, not the bare name).

fn main() {
    let map = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("libxwarp_ibverbs.map");
    println!("cargo:rerun-if-changed={}", map.display());
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        map.display()
    );
}
