//! Links the `lull` binary so its text segment starts on a 2 MiB boundary (a load segment
//! alignment of 2 MiB, which Linux's loader honours for position-independent executables too):
//! `sys::huge_text` can then move the whole text onto huge pages.

fn main() {
    println!("cargo:rustc-link-arg-bin=lull=-Wl,-z,max-page-size=0x200000");
    println!("cargo:rerun-if-changed=build.rs");
}
