//! Builds what the daemon embeds and shares with the kernel side:
//! - every `ebpf/*.bpf.c`, compiled by clang for the bpf target twice: a tp_btf object
//!   and a raw_tp object (`-DSTALLTRACE_RAW_TP`), the fallback chosen at load time;
//! - `ebpf/include/abi.h` -> Rust types (bindgen), so shared structs are defined once;
//! - `ebpf/include/hist.h` compiled for the host, so the Rust histogram math is tested
//!   against the C one;
//! - `ebpf/include/tds.h` compiled for the host and its constants -> Rust (bindgen), so
//!   the kernel's TDS header decision is tested as C and the Rust parser shares its
//!   constants.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let ebpf = manifest.join("../ebpf");
    let include = ebpf.join("include");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());

    // Any change under ebpf/ (a program or a header) rebuilds.
    println!("cargo:rerun-if-changed={}", ebpf.display());
    for dir in [&ebpf, &include] {
        for entry in std::fs::read_dir(dir).expect("read ebpf/") {
            println!("cargo:rerun-if-changed={}", entry.unwrap().path().display());
        }
    }
    println!("cargo:rerun-if-env-changed=CLANG");

    compile_bpf_objects(&ebpf, &include, &out);
    generate_abi(&include, &out);
    compile_host_hist(&manifest, &include);
    compile_host_tds(&manifest, &include, &out);
}

fn compile_bpf_objects(ebpf: &Path, include: &Path, out: &Path) {
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let mut sources: Vec<PathBuf> = std::fs::read_dir(ebpf)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".bpf.c"))
        .collect();
    sources.sort();
    let mut list = String::new();
    for src in &sources {
        let family = src
            .file_name()
            .unwrap()
            .to_string_lossy()
            .trim_end_matches(".bpf.c")
            .to_string();
        for (flavour, defines) in [
            ("tp_btf", &[][..]),
            ("raw_tp", &["-DSTALLTRACE_RAW_TP"][..]),
        ] {
            let obj = out.join(format!("{family}.{flavour}.bpf.o"));
            let status = Command::new(&clang)
                .args(["-target", "bpf", "-D__TARGET_ARCH_x86", "-O2", "-g"])
                .args(["-Wall", "-Werror", "-mcpu=v3"])
                .args(defines)
                .arg("-I")
                .arg(include)
                .arg("-c")
                .arg(src)
                .arg("-o")
                .arg(&obj)
                .status()
                .unwrap_or_else(|e| {
                    panic!("cannot run {clang} ({e}): install clang, e.g. with `cargo xtask setup`")
                });
            assert!(status.success(), "clang failed on {}", src.display());
            // llvm-strip would drop BTF; keep the objects as they are (aya needs .BTF/.BTF.ext).
        }
        list.push_str(&format!(
            "crate::probes::EmbeddedFamily {{ name: {family:?}, tp_btf: aya::include_bytes_aligned!(concat!(env!(\"OUT_DIR\"), \"/{family}.tp_btf.bpf.o\")), raw_tp: aya::include_bytes_aligned!(concat!(env!(\"OUT_DIR\"), \"/{family}.raw_tp.bpf.o\")) }},\n"
        ));
    }
    std::fs::write(out.join("families.rs"), format!("&[\n{list}]")).unwrap();
}

fn generate_abi(include: &Path, out: &Path) {
    bindgen::Builder::default()
        .header(include.join("abi.h").to_string_lossy())
        .allowlist_file(".*/abi\\.h")
        .derive_default(true)
        .derive_debug(true)
        .prepend_enum_name(false)
        .default_enum_style(bindgen::EnumVariation::Consts)
        .layout_tests(true)
        .generate()
        .expect("bindgen on ebpf/include/abi.h (needs libclang: `cargo xtask setup`)")
        .write_to_file(out.join("abi.rs"))
        .unwrap();
}

fn compile_host_hist(manifest: &Path, include: &Path) {
    cc::Build::new()
        .file(manifest.join("csrc/hist_shim.c"))
        .include(include)
        .warnings_into_errors(true)
        .compile("stalltrace_hist_c");
    println!(
        "cargo:rerun-if-changed={}",
        manifest.join("csrc/hist_shim.c").display()
    );
}

fn compile_host_tds(manifest: &Path, include: &Path, out: &Path) {
    let shim = manifest.join("csrc/tds_shim.c");
    cc::Build::new()
        .file(&shim)
        .include(include)
        .warnings_into_errors(true)
        .compile("stalltrace_tds_c");
    println!("cargo:rerun-if-changed={}", shim.display());
    bindgen::Builder::default()
        .header(include.join("tds.h").to_string_lossy())
        .allowlist_file(".*/tds\\.h")
        .allowlist_var("(TDS|TLS)_.*")
        .prepend_enum_name(false)
        .default_enum_style(bindgen::EnumVariation::Consts)
        .generate()
        .expect("bindgen on ebpf/include/tds.h (needs libclang: `cargo xtask setup`)")
        .write_to_file(out.join("tds.rs"))
        .unwrap();
}
