//! Links the `lull` binary with a 2 MiB segment alignment (which Linux's loader honours for
//! position-independent executables too): its segments load 2 MiB apart, so the huge pages
//! that its text only partly fills hold no other mapping and `sys::huge_text` (`--huge-text
//! on`) can move them whole.

fn main() {
    println!("cargo:rustc-link-arg-bin=lull=-Wl,-z,max-page-size=0x200000");
    println!("cargo:rerun-if-changed=build.rs");
}
