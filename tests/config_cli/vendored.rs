//! Issue 55 item 3: the patched dependency in third_party/ is visible and guarded. The tree is
//! exactly the crates.io release third_party/upstream.toml names (its .crate checked against
//! the SHA-256 recorded there) plus the patch files it lists, in order; the SBOM gives the
//! crate the upstream purl and a CycloneDX pedigree (ancestor, patches); the image's SBOM lists
//! its system packages; the runtime packages and the suite's cargo tools are pinned.

use super::common;
use super::supply_chain::{dockerfile, flag_value, sbom_of_this_tree, stages};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use sha2::{Digest, Sha256};

fn upstream_toml() -> toml::Table {
    let path = common::repo_root().join("third_party/upstream.toml");
    toml::from_str(&std::fs::read_to_string(path).expect("third_party/upstream.toml"))
        .expect("TOML")
}

/// `$CARGO_HOME/registry/{src,cache}/<index>/<name>-<version>[.crate]`, if cargo has it.
fn registry_copy(name: &str, version: &str) -> Option<(PathBuf, PathBuf)> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))?;
    let stem = format!("{name}-{version}");
    for index in std::fs::read_dir(home.join("registry/src")).ok()?.flatten() {
        let src = index.path().join(&stem);
        let krate = home
            .join("registry/cache")
            .join(index.file_name())
            .join(format!("{stem}.crate"));
        if src.join("Cargo.toml").is_file() && krate.is_file() {
            return Some((src, krate));
        }
    }
    None
}

/// The upstream release: cargo's copy, else a throwaway `cargo fetch` of a manifest that
/// depends on exactly that version (the network, once per machine). None when neither works
/// (no network outside CI: the test skips; under CI=true it fails).
fn upstream_crate(name: &str, version: &str) -> Option<(PathBuf, PathBuf)> {
    if let Some(found) = registry_copy(name, version) {
        return Some(found);
    }
    let dir = std::env::temp_dir().join(format!("msgxt_fetch_{}", std::process::id()));
    std::fs::create_dir_all(dir.join("src")).expect("fetch dir");
    std::fs::write(dir.join("src/lib.rs"), "").expect("lib.rs");
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"msgxt-fetch\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
             [dependencies]\n{name} = {{ version = \"={version}\", default-features = false }}\n"
        ),
    )
    .expect("manifest");
    let fetched = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .arg("fetch")
        .current_dir(&dir)
        .env_remove("CARGO_TARGET_DIR")
        .output();
    let _ = std::fs::remove_dir_all(&dir);
    match fetched {
        Ok(out) if out.status.success() => registry_copy(name, version),
        _ => None,
    }
}

/// Every file under `root` (relative path → bytes), cargo's `.cargo-ok` marker left out.
fn tree(root: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(root, &path, out);
            } else if entry.file_name() != ".cargo-ok" {
                let rel = path.strip_prefix(root).expect("under root").to_path_buf();
                out.insert(rel, std::fs::read(&path).expect("read"));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// Copies `from` into `to` (both directories).
fn copy_tree(from: &Path, to: &Path) {
    for (rel, bytes) in tree(from) {
        let dest = to.join(rel);
        std::fs::create_dir_all(dest.parent().expect("parent")).expect("mkdir");
        std::fs::write(dest, bytes).expect("write");
    }
}

/// Each crate of third_party/upstream.toml: its .crate is the one crates.io published (the
/// recorded SHA-256, which cargo checked against the index when it fetched it); that
/// release with the listed patches applied (`patch -p1`, in order, each applying cleanly) is
/// byte for byte the vendored directory, which has no file more or less.
#[test]
fn the_vendored_tree_is_upstream_plus_its_patches() {
    for (name, upstream) in upstream_toml() {
        let version = upstream["version"].as_str().expect("version");
        let Some((src, krate)) = upstream_crate(&name, version) else {
            assert!(
                std::env::var("CI").is_err(),
                "CI: crates.io's {name} {version} must be reachable (cargo fetch)"
            );
            eprintln!("SKIP: no copy of {name} {version} and no network to fetch it");
            return;
        };
        let sum = format!(
            "{:x}",
            Sha256::digest(std::fs::read(&krate).expect("crate"))
        );
        assert_eq!(Some(sum.as_str()), upstream["checksum"].as_str(), "{name}");
        let work =
            std::env::temp_dir().join(format!("msgxt_vendored_{}_{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&work);
        copy_tree(&src, &work);
        for p in upstream["patches"].as_array().expect("patches") {
            let file = common::repo_root()
                .join("third_party")
                .join(p["file"].as_str().expect("file"));
            let out = Command::new("patch")
                .args([
                    "-p1",
                    "--forward",
                    "--batch",
                    "--no-backup-if-mismatch",
                    "-i",
                ])
                .arg(&file)
                .current_dir(&work)
                .output()
                .expect("patch(1)");
            assert!(
                out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("fuzz"),
                "{} applies cleanly: {}",
                file.display(),
                String::from_utf8_lossy(&out.stdout)
            );
        }
        let (want, have) = (
            tree(&work),
            tree(&common::repo_root().join("third_party").join(&name)),
        );
        let _ = std::fs::remove_dir_all(&work);
        let names = |t: &BTreeMap<PathBuf, Vec<u8>>| t.keys().cloned().collect::<Vec<_>>();
        assert_eq!(
            names(&have),
            names(&want),
            "{name}: the same files as upstream"
        );
        for (rel, bytes) in &want {
            assert!(
                have[rel] == *bytes,
                "third_party/{name}/{}: not upstream plus the patches (third_party/README.md)",
                rel.display()
            );
        }
    }
}

/// The patched crate in the SBOM: the upstream release's purl (advisories for it match), and
/// a pedigree with that release (purl, crates.io SHA-256) as ancestor and one `patches` record
/// per patch file, its type and diff as in third_party/upstream.toml.
#[test]
fn the_sbom_names_the_patched_crates_upstream_and_patches() {
    let sbom = sbom_of_this_tree();
    let components = sbom["components"].as_array().expect("components");
    for (name, upstream) in upstream_toml() {
        let version = upstream["version"].as_str().expect("version");
        let purl = format!("pkg:cargo/{name}@{version}");
        let c = components
            .iter()
            .find(|c| c["name"] == name.as_str())
            .unwrap_or_else(|| panic!("the SBOM lists {name}"));
        assert_eq!(c["purl"].as_str(), Some(purl.as_str()), "{c}");
        let pedigree = &c["pedigree"];
        let ancestor = &pedigree["ancestors"][0];
        assert_eq!(ancestor["purl"].as_str(), Some(purl.as_str()));
        assert_eq!(ancestor["hashes"][0]["alg"], "SHA-256");
        assert_eq!(
            ancestor["hashes"][0]["content"].as_str(),
            upstream["checksum"].as_str()
        );
        let patches = pedigree["patches"].as_array().expect("pedigree.patches");
        let listed = upstream["patches"].as_array().expect("patches");
        assert_eq!(patches.len(), listed.len(), "one record per patch file");
        for (record, p) in patches.iter().zip(listed) {
            let file = p["file"].as_str().expect("file");
            let text = std::fs::read_to_string(common::repo_root().join("third_party").join(file))
                .expect("patch file");
            assert_eq!(record["type"].as_str(), p["type"].as_str(), "{file}");
            assert!(
                ["unofficial", "monkey", "backport", "cherry-pick"]
                    .contains(&record["type"].as_str().unwrap_or_default()),
                "{file}: a CycloneDX patch type"
            );
            assert_eq!(
                record["diff"]["text"]["content"].as_str(),
                Some(text.as_str())
            );
            assert!(record["resolves"][0]["type"].is_string(), "{record}");
        }
    }
}

/// The image's SBOM covers its system libraries: the build stage runs scripts/sbom.py on the
/// runtime stage's dpkg database and os-release, copied from the stage the image is built
/// FROM; the runtime packages are pinned by version. scripts/sbom.py on this (Debian) host's
/// database lists the libraries the binary loads with `pkg:deb` purls.
#[test]
fn the_image_sbom_lists_its_pinned_system_packages() {
    let all = stages(dockerfile());
    let last = all.last().expect("stages");
    let base = last[0].args.split_whitespace().next().expect("FROM");
    let runtime = all
        .iter()
        .find(|s| s[0].args.ends_with(&format!(" AS {base}")))
        .expect("the image is built FROM a runtime stage of this file");
    let installed: Vec<&str> = runtime
        .iter()
        .filter(|i| i.op == "RUN")
        .filter_map(|i| i.args.split("apt-get install").nth(1))
        .flat_map(|rest| {
            rest.split("&&")
                .next()
                .unwrap_or_default()
                .split_whitespace()
        })
        .filter(|w| !w.starts_with('-'))
        .collect();
    assert!(
        installed.iter().any(|p| p.starts_with("libssl3=")),
        "{installed:?}"
    );
    for p in &installed {
        assert!(
            p.split_once('=').is_some_and(|(_, v)| !v.is_empty()),
            "apt-get install {p}: pin the version (package=version)"
        );
    }
    let build = all
        .iter()
        .find(|s| s[0].args.ends_with(" AS build"))
        .expect("build stage");
    let copied = build
        .iter()
        .find(|i| i.op == "COPY" && i.args.starts_with(&format!("--from={base} ")))
        .expect("the build stage copies the runtime stage's package database");
    assert!(
        copied.args.contains("/var/lib/dpkg/status"),
        "{}",
        copied.args
    );
    let made = build
        .iter()
        .find_map(|i| i.args.split("scripts/sbom.py").nth(1))
        .expect("scripts/sbom.py");
    let words: Vec<&str> = made.split_whitespace().collect();
    for flag in ["--dpkg-status", "--os-release"] {
        let path = flag_value(&words, &[flag]).unwrap_or_else(|| panic!("sbom.py {flag}"));
        let file = Path::new(path)
            .file_name()
            .expect("file name")
            .to_string_lossy();
        let dest = copied.args.split_whitespace().last().expect("COPY dest");
        assert!(
            dest.ends_with('/') && path.starts_with(dest),
            "{flag} {path}: a file that COPY brought to {dest}"
        );
        assert!(
            copied.args.contains(&format!("/{file} ")),
            "{flag}: {}",
            copied.args
        );
    }

    let status = Path::new("/var/lib/dpkg/status");
    if !status.is_file() {
        eprintln!("SKIP: no dpkg database on this host to run scripts/sbom.py over");
        return;
    }
    let out = common::process::succeed(
        Command::new("python3")
            .arg(common::repo_root().join("scripts/sbom.py"))
            .args(["--offline", "--dpkg-status"])
            .arg(status)
            .args(["--os-release", "/usr/lib/os-release"]),
        "scripts/sbom.py --dpkg-status",
    );
    let sbom: Value = serde_json::from_slice(&out.stdout).expect("SBOM JSON");
    let components = sbom["components"].as_array().expect("components");
    for lib in ["libc6", "libssl3", "zlib1g"] {
        let c = components
            .iter()
            .find(|c| c["name"] == lib)
            .unwrap_or_else(|| panic!("the SBOM lists {lib}"));
        let purl = c["purl"].as_str().unwrap_or_default();
        assert!(
            purl.starts_with(&format!("pkg:deb/debian/{lib}@")) && purl.contains("distro=debian-"),
            "{c}"
        );
    }
    assert!(
        components.iter().any(|c| c["name"] == "sqlx-core"),
        "the crates stay"
    );
}

/// The suite's cargo tools are installed by version (scripts/test.sh `cargo_tool NAME
/// VERSION`), and no `cargo install` in the scripts takes whatever crates.io has that day.
#[test]
fn the_suites_cargo_tools_are_pinned_by_version() {
    let script =
        std::fs::read_to_string(common::repo_root().join("scripts/test.sh")).expect("test.sh");
    for tool in ["cargo-deny", "cargo-deb"] {
        let pinned = script.lines().any(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.len() == 3 && w[0] == "cargo_tool" && w[1] == tool && w[2].split('.').count() == 3
        });
        assert!(pinned, "scripts/test.sh: cargo_tool {tool} X.Y.Z");
    }
    for entry in std::fs::read_dir(common::repo_root().join("scripts"))
        .expect("scripts")
        .flatten()
    {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
            if line.contains("cargo install ") && !line.contains("cargo install --list") {
                assert!(
                    line.contains("--version") && line.contains("--locked"),
                    "{}: {line}",
                    entry.path().display()
                );
            }
        }
    }
}
