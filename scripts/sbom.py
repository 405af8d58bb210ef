#!/usr/bin/env python3
"""The CycloneDX 1.5 SBOM (JSON) of the msgexchange binary, from `cargo metadata --locked` and
Cargo.lock: every crate the binary is built from (`pkg:cargo/name@version`, its SPDX licence
expression, the SHA-256 Cargo.lock pins for it), the C library bundled into rdkafka-sys, and
the dependency graph. Crates needed only to build (build scripts and their dependencies) are
listed with scope "excluded": they run on the build machine and are not in the binary.

A patched dependency (third_party/, [patch.crates-io]) has no source or checksum in Cargo.lock:
third_party/upstream.toml names the crates.io release it was unpacked from, so its component
carries that release's purl (advisories for it match) and a CycloneDX pedigree: the upstream
release as ancestor (with its crates.io SHA-256) and each patch file as a `patches` record.

With --dpkg-status (the container image: the runtime stage's /var/lib/dpkg/status) and
--os-release, the system packages installed there are listed too (`pkg:deb/debian/...`): the
shared libraries the binary loads (libssl3, zlib1g, libc6) and the rest of the image.

Deterministic (no timestamp; the serial number is derived from Cargo.lock), so the same lock
gives the same file. Used by scripts/package.sh (the Debian package) and the Dockerfile (the
image); checked by tests/config_cli.rs (sbom_*, the package test).

    scripts/sbom.py [--offline] [--dpkg-status FILE --os-release FILE] [--out FILE]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tomllib
import uuid
from urllib.parse import quote

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
THIRD_PARTY = os.path.join(ROOT, "third_party")
BINARY_PACKAGE = "msgx-actors"
CRATES_IO = "registry+https://github.com/rust-lang/crates.io-index"
# rdkafka-sys builds librdkafka from the sources it bundles and links it statically: the
# version after `+` in rdkafka-sys's version is librdkafka's (rdkafka-sys's own convention).
BUNDLED_C = {"rdkafka-sys": ("librdkafka", "confluentinc/librdkafka", "BSD-2-Clause")}


def host_triple():
    out = subprocess.run(["rustc", "-vV"], capture_output=True, text=True, check=True).stdout
    return next(l.split(": ", 1)[1] for l in out.splitlines() if l.startswith("host: "))


def metadata(offline):
    cmd = ["cargo", "metadata", "--format-version", "1", "--locked",
           "--filter-platform", host_triple(), "--manifest-path", os.path.join(ROOT, "Cargo.toml")]
    if offline:
        cmd.append("--offline")
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def lock_checksums():
    with open(os.path.join(ROOT, "Cargo.lock"), "rb") as f:
        lock = tomllib.load(f)
    return {(p["name"], p["version"]): p.get("checksum") for p in lock["package"]}


def reachable(meta, root_id):
    """Package ids the root needs, each "required" (reached from the root through normal
    dependencies only: linked into the binary) or "excluded" (only through a build dependency
    or a procedural macro: it runs on the build machine)."""
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    macros = {p["id"] for p in meta["packages"]
              if any("proc-macro" in t["kind"] for t in p["targets"])}

    def closure(kinds):
        seen, stack = {root_id}, [root_id]
        while stack:
            for dep in nodes[stack.pop()]["deps"]:
                wanted = {k["kind"] for k in dep["dep_kinds"]} & kinds
                if wanted and dep["pkg"] not in seen and (dep["pkg"] not in macros or "build" in kinds):
                    seen.add(dep["pkg"])
                    stack.append(dep["pkg"])
        return seen

    required = closure({None})
    return nodes, {p: "required" if p in required else "excluded" for p in closure({None, "build"})}


def licence(expr):
    # Old crates write `MIT/Apache-2.0`: the SPDX form is `MIT OR Apache-2.0`.
    return [{"expression": re.sub(r"\s*/\s*", " OR ", expr)}] if expr else []


def vendored():
    """third_party/upstream.toml: crate name -> its upstream release and patches."""
    with open(os.path.join(THIRD_PARTY, "upstream.toml"), "rb") as f:
        return tomllib.load(f)


def pedigree(pkg, upstream):
    """The CycloneDX pedigree of a patched crate: the crates.io release it was unpacked from
    (purl and SHA-256 of the .crate) and every patch applied to it, with its diff."""
    name, version = pkg["name"], upstream["version"]
    ancestor = {"type": "library", "bom-ref": f"crates.io:{name}@{version}", "name": name,
                "version": version, "purl": f"pkg:cargo/{name}@{quote(version)}",
                "hashes": [{"alg": "SHA-256", "content": upstream["checksum"]}]}
    patches = []
    for p in upstream["patches"]:
        with open(os.path.join(THIRD_PARTY, p["file"])) as f:
            diff = {"text": {"contentType": "text/x-diff", "content": f.read()},
                    "url": f"third_party/{p['file']}"}
        issue = {"type": "defect", "name": p["file"], "description": p["resolves"]}
        if p.get("url"):
            issue["references"] = [p["url"]]
        patches.append({"type": p["type"], "diff": diff, "resolves": [issue]})
    return {"ancestors": [ancestor], "patches": patches,
            "notes": f"crates.io {name} {version} unpacked in third_party/ with the patches "
                     "above (third_party/README.md); used through [patch.crates-io]"}


def component(pkg, scope, sums):
    ref = f"{pkg['name']}@{pkg['version']}"
    c = {"type": "library", "bom-ref": ref, "name": pkg["name"], "version": pkg["version"],
         "scope": scope}
    if pkg.get("description"):
        c["description"] = " ".join(pkg["description"].split())
    if pkg["source"] == CRATES_IO:
        c["purl"] = f"pkg:cargo/{pkg['name']}@{quote(pkg['version'])}"
    elif pkg["manifest_path"].startswith(THIRD_PARTY + os.sep):
        upstream = vendored()[pkg["name"]]
        assert upstream["version"] == pkg["version"], f"third_party/upstream.toml: {pkg['name']}"
        # The upstream release's purl: what vulnerability databases index it by.
        c["purl"] = f"pkg:cargo/{pkg['name']}@{quote(pkg['version'])}"
        c["pedigree"] = pedigree(pkg, upstream)
    checksum = sums.get((pkg["name"], pkg["version"]))
    if checksum:
        c["hashes"] = [{"alg": "SHA-256", "content": checksum}]
    if pkg.get("license"):
        c["licenses"] = licence(pkg["license"])
    if pkg.get("repository"):
        c["externalReferences"] = [{"type": "vcs", "url": pkg["repository"]}]
    return c


def bundled(pkg, scope):
    name, repo, lic = BUNDLED_C[pkg["name"]]
    version = pkg["version"].split("+", 1)[1]
    return {"type": "library", "bom-ref": f"{name}@{version}", "name": name, "version": version,
            "scope": scope, "purl": f"pkg:github/{repo}@v{quote(version)}",
            "licenses": [{"license": {"id": lic}}],
            "description": f"C library bundled in {pkg['name']} and linked statically"}


def os_release(path):
    with open(path) as f:
        pairs = (l.rstrip("\n").split("=", 1) for l in f if "=" in l)
        return {k: v.strip('"') for k, v in pairs}


def dpkg_packages(status_path, release_path):
    """The packages installed according to a dpkg status file, as CycloneDX components with
    `pkg:deb` purls (distro from os-release, e.g. debian-12)."""
    rel = os_release(release_path)
    vendor, distro = rel["ID"], f"{rel['ID']}-{rel.get('VERSION_ID', '')}"
    with open(status_path) as f:
        paragraphs = f.read().split("\n\n")
    out = []
    for para in paragraphs:
        fields, last = {}, None
        for line in para.splitlines():
            if line[:1] in (" ", "\t") and last:
                continue  # a continuation line (descriptions, conffiles)
            if ":" in line:
                last, value = line.split(":", 1)
                fields[last] = value.strip()
        if not fields.get("Package") or not fields.get("Status", "").endswith(" installed"):
            continue
        name, version, arch = fields["Package"], fields["Version"], fields["Architecture"]
        c = {"type": "library" if fields.get("Section", "").endswith("libs") else "application",
             "bom-ref": f"deb:{name}@{version}", "name": name, "version": version,
             "scope": "required",
             "purl": f"pkg:deb/{vendor}/{name}@{quote(version)}?arch={arch}&distro={distro}",
             "description": f"{rel.get('PRETTY_NAME', distro)} package in the runtime image"}
        if fields.get("Source"):
            c["properties"] = [{"name": "deb:source", "value": fields["Source"]}]
        out.append(c)
    return sorted(out, key=lambda c: c["bom-ref"])


def sbom(meta, system=()):
    pkgs = {p["id"]: p for p in meta["packages"]}
    root_id = next(i for i, p in pkgs.items()
                   if p["name"] == BINARY_PACKAGE and i in meta["workspace_members"])
    nodes, scope = reachable(meta, root_id)
    sums = lock_checksums()
    ref = {i: f"{pkgs[i]['name']}@{pkgs[i]['version']}" for i in scope}
    components, deps = [], []
    for pid in sorted(scope, key=lambda i: ref[i]):
        on = sorted({ref[d["pkg"]] for d in nodes[pid]["deps"] if d["pkg"] in scope
                     and {k["kind"] for k in d["dep_kinds"]} - {"dev"}})
        if pkgs[pid]["name"] in BUNDLED_C:
            c = bundled(pkgs[pid], scope[pid])
            components.append(c)
            deps.append({"ref": c["bom-ref"], "dependsOn": []})
            on.append(c["bom-ref"])
        if pid != root_id:
            components.append(component(pkgs[pid], scope[pid], sums))
        deps.append({"ref": ref[pid], "dependsOn": on})
    root = pkgs[root_id]
    with open(os.path.join(ROOT, "Cargo.lock"), "rb") as f:
        serial = uuid.uuid5(uuid.NAMESPACE_URL, "msgexchange-sbom:" + f.read().hex())
    return {
        "bomFormat": "CycloneDX", "specVersion": "1.5", "version": 1,
        "serialNumber": f"urn:uuid:{serial}",
        "metadata": {
            "tools": {"components": [{"type": "application", "name": "scripts/sbom.py"}]},
            "component": {"type": "application", "bom-ref": ref[root_id], "name": "msgexchange",
                          "version": root["version"], "licenses": licence(root.get("license")),
                          "description": "msgexchange (binary of the msgx-actors crate)"},
        },
        "components": components + list(system),
        "dependencies": sorted(deps + [{"ref": c["bom-ref"], "dependsOn": []} for c in system],
                               key=lambda d: d["ref"]),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--offline", action="store_true", help="pass --offline to cargo")
    ap.add_argument("--out", help="write here instead of stdout")
    ap.add_argument("--dpkg-status", help="list the packages this dpkg status file names")
    ap.add_argument("--os-release", help="the os-release of that system (with --dpkg-status)")
    args = ap.parse_args()
    if bool(args.dpkg_status) != bool(args.os_release):
        ap.error("--dpkg-status and --os-release go together")
    system = dpkg_packages(args.dpkg_status, args.os_release) if args.dpkg_status else ()
    text = json.dumps(sbom(metadata(args.offline), system), indent=1, sort_keys=True) + "\n"
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
