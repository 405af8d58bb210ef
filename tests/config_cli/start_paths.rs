//! Issue 55 item 1: every start path the README and docs offer comes up on first try with the
//! settings the docs say a site must give, or refuses in one line naming the missing key with
//! exit 2 — never a restart loop. No Docker daemon and no systemd here: what the image and
//! `docker compose up` would run is read from the Dockerfile and docker-compose.yml themselves
//! (entrypoint, command, environment, the configuration file the image copies), what the
//! template unit would run from packaging/msgexchange@.service, and the real binary is started
//! with exactly that, the compose hosts mapped to loopback (a Kafka mock cluster for `kafka`).

use super::common;
use super::supply_chain::{dockerfile, stages, Instruction};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::instance::{log_dir, Instance};
use common::kafka::RawMock;
use common::service::{free_port, wait_for};
use common::TestEnv;
use serde_json::Value;

/// What the runtime image runs: its entrypoint and command, its environment, and the repository
/// file behind each path it copies from the build context.
struct Image {
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    env: BTreeMap<String, String>,
    copies: BTreeMap<String, PathBuf>,
    expose: u16,
    healthcheck: String,
}

/// A JSON-array instruction (`ENTRYPOINT ["msgexchange"]`).
fn exec_form(i: &Instruction) -> Vec<String> {
    serde_json::from_str(&i.args)
        .unwrap_or_else(|e| panic!("{} {}: the exec (JSON) form: {e}", i.op, i.args))
}

/// The last stage with the stages it is built `FROM` (by name) before it, in build order.
fn image() -> Image {
    let all = stages(dockerfile());
    let mut chain = vec![all.last().expect("a stage")];
    loop {
        let first: &Vec<Instruction> = chain[0];
        let base = first[0].args.split_whitespace().next().expect("FROM image");
        match all
            .iter()
            .find(|s| s[0].args.ends_with(&format!(" AS {base}")))
        {
            Some(stage) => chain.insert(0, stage),
            None => break,
        }
    }
    let mut img = Image {
        entrypoint: Vec::new(),
        cmd: Vec::new(),
        env: BTreeMap::new(),
        copies: BTreeMap::new(),
        expose: 0,
        healthcheck: String::new(),
    };
    for i in chain.into_iter().flatten() {
        match i.op.as_str() {
            "ENV" => {
                for pair in i.args.split_whitespace() {
                    let (k, v) = pair.split_once('=').expect("ENV KEY=VALUE");
                    img.env.insert(k.to_string(), v.to_string());
                }
            }
            "ENTRYPOINT" => img.entrypoint = exec_form(i),
            "CMD" => img.cmd = exec_form(i),
            "COPY" if !i.args.starts_with("--") => {
                let (src, dest) = i.args.split_once(' ').expect("COPY SRC DEST");
                img.copies
                    .insert(dest.trim().to_string(), common::repo_root().join(src));
            }
            "EXPOSE" => img.expose = i.args.parse().expect("EXPOSE PORT"),
            "HEALTHCHECK" => img.healthcheck = i.args.clone(),
            _ => {}
        }
    }
    img
}

/// The entrypoint followed by `cmd` (the image's CMD, or what compose's `command` replaces it
/// with).
fn argv(img: &Image, cmd: &[String]) -> Vec<String> {
    img.entrypoint.iter().chain(cmd).cloned().collect()
}

/// The repository file the image's `MSGEXCHANGE_CONFIG` names (copied there by a COPY of the
/// file or of a directory holding it).
fn image_config(img: &Image) -> PathBuf {
    let path = img
        .env
        .get("MSGEXCHANGE_CONFIG")
        .expect("ENV MSGEXCHANGE_CONFIG");
    let file = img
        .copies
        .iter()
        .find_map(|(dest, src)| match Path::new(path).strip_prefix(dest) {
            Ok(rest) if rest.as_os_str().is_empty() => Some(src.clone()),
            Ok(rest) => Some(src.join(rest)),
            Err(_) => None,
        })
        .unwrap_or_else(|| panic!("no COPY puts a file at {path}"));
    assert!(file.is_file(), "{}", file.display());
    file
}

fn toml_file(path: &Path) -> toml::Table {
    toml::from_str(&std::fs::read_to_string(path).expect("read")).expect("TOML")
}

/// `argv` (its program the image's `msgexchange`: this build's binary) with exactly `env` and
/// nothing inherited, logging to its own file; `port` is where it serves HTTP.
fn start(argv: &[String], env: &BTreeMap<String, String>, name: &str, port: u16) -> Instance {
    assert!(
        argv[0] == "msgexchange" || argv[0] == "/usr/bin/msgexchange",
        "{argv:?}"
    );
    let log = std::fs::File::create(log_dir().join(format!("{name}.log"))).expect("log");
    let child = Command::new(common::instance::msgexchange_path())
        .args(&argv[1..])
        .env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn msgexchange");
    Instance {
        child,
        port,
        name: name.to_string(),
    }
}

/// Starts it and expects the refusal: exit 2, naming `key`.
async fn refused(argv: &[String], env: &BTreeMap<String, String>, name: &str, key: &str) {
    let mut svc = start(argv, env, name, 0);
    let exit = svc.exited_within(Duration::from_secs(30)).await;
    let log = svc.log();
    assert_eq!(exit.and_then(|e| e.code()), Some(2), "{name}: {log}");
    let refusal = log
        .lines()
        .find(|l| l.starts_with("msgexchange: "))
        .unwrap_or_else(|| panic!("{name}: the refusal's line: {log}"));
    assert!(refusal.contains(key), "{name}: names {key}: {refusal}");
}

/// `scheme://user@HOST:PORT/DB` with the host a compose service: on loopback, this test's DB.
fn to_loopback(url: &str, service: &str, db: &str) -> String {
    let (head, tail) = url.split_once('@').expect("user@host");
    let (hostport, _db) = tail.split_once('/').expect("/database");
    let (host, port) = hostport.split_once(':').expect("host:port");
    assert_eq!(host, service, "{url}: the compose service {service}");
    format!("{head}@127.0.0.1:{port}/{db}")
}

fn compose_service(name: &str) -> Value {
    let text = std::fs::read_to_string(common::repo_root().join("docker-compose.yml"))
        .expect("docker-compose.yml");
    let all: Value = serde_yaml_ng::from_str(&text).expect("compose YAML");
    all["services"][name].clone()
}

/// A restart policy that gives up: `no`, or `on-failure` with a small maximum. `always` and
/// `unless-stopped` restart a refusal (exit 2) for ever.
fn assert_bounded_restarts(svc: &Value) {
    let policy = svc["restart"].as_str().unwrap_or("no");
    let bounded = policy == "no"
        || policy
            .strip_prefix("on-failure:")
            .and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|n| (1..=10).contains(&n));
    assert!(bounded, "restart: {policy} restarts a refusal in a loop");
}

/// The image alone, as a site runs it (`docker run` with no settings yet): its configuration
/// is a site's (TLS verifying every server, the listener on the EXPOSEd port of every
/// interface), not config/default.toml; each setting the docs ask a site for is refused in
/// turn, by name, with exit 2, until all are given.
#[tokio::test]
async fn the_image_is_configured_for_a_site_and_names_each_missing_setting() {
    let img = image();
    let config = image_config(&img);
    assert_ne!(
        config,
        common::default_toml(),
        "the image ships the dev config"
    );
    let t = toml_file(&config);
    let listen = t["http"]["listen"].as_str().expect("http.listen");
    assert_eq!(
        listen,
        format!("0.0.0.0:{}", img.expose),
        "EXPOSE, scrapeable"
    );
    assert!(
        img.healthcheck
            .contains(&format!("/dev/tcp/127.0.0.1/{}", img.expose)),
        "{}",
        img.healthcheck
    );
    assert_eq!(t["inbox"]["ssl_mode"].as_str(), Some("VERIFY_IDENTITY"));
    assert_eq!(t["store"]["ssl_mode"].as_str(), Some("verify-full"));
    assert_eq!(t["kafka"]["security_protocol"].as_str(), Some("ssl"));

    let mut env = img.env.clone();
    env.insert("MSGEXCHANGE_CONFIG".into(), config.display().to_string());
    let site = [
        (
            "MSGX_INBOX__URL",
            "mysql://msgexchange@127.0.0.1:3306/aodb",
            "inbox.url",
        ),
        (
            "MSGX_STORE__URL",
            "postgres://msgexchange@127.0.0.1:5432/msgx",
            "store.url",
        ),
        ("MSGX_KAFKA__BROKERS", "127.0.0.1:9", "kafka.brokers"),
        (
            "MSGX_KAFKA__CE_SOURCE",
            "//pek.test/msgexchange",
            "kafka.ce_source",
        ),
    ];
    for (n, (var, value, key)) in site.into_iter().enumerate() {
        refused(
            &argv(&img, &img.cmd),
            &env,
            &format!("image-missing-{n}"),
            key,
        )
        .await;
        env.insert(var.into(), value.into());
    }
}

/// `docker compose up`: the msgexchange service's command and environment from
/// docker-compose.yml over the image's entrypoint, environment and configuration file, the
/// hosts `mysql`, `postgres` and `kafka` mapped to loopback (this test's databases, a Kafka mock
/// cluster with the topics the compose job creates). It becomes ready and processes a message
/// on its first start; without `MSGX_KAFKA__CE_SOURCE` (the restart loop) it refuses
/// with exit 2 naming the key, and the restart policy does not loop on that.
#[tokio::test]
async fn compose_up_runs_first_time_and_a_refusal_does_not_loop() {
    let img = image();
    let svc = compose_service("msgexchange");
    assert_bounded_restarts(&svc);
    let command: Vec<String> = serde_json::from_value(svc["command"].clone()).expect("command");
    let argv = argv(&img, &command);

    let env = TestEnv::new("compose").await;
    let (topic, dlq) = (&env.base.kafka.topic, &env.base.kafka.dlq_topic);
    let mock = RawMock::new(1, &[(topic.as_str(), 6), (dlq.as_str(), 6)]);
    let port = free_port();
    let mut vars = img.env.clone();
    vars.insert(
        "MSGEXCHANGE_CONFIG".into(),
        image_config(&img).display().to_string(),
    );
    let compose_env = svc["environment"].as_object().expect("environment");
    for (k, v) in compose_env {
        let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
        let v = match k.as_str() {
            "MSGX_INBOX__URL" => to_loopback(&v, "mysql", &env.db),
            "MSGX_STORE__URL" => to_loopback(&v, "postgres", &env.db),
            "MSGX_KAFKA__BROKERS" => {
                assert_eq!(v, "kafka:9092");
                mock.bootstrap()
            }
            "MSGX_HTTP__LISTEN" => v.replace(":9464", &format!(":{port}")),
            _ => v,
        };
        vars.insert(k.clone(), v);
    }
    let ids = env.insert_rows(2).await;
    let mut up = start(&argv, &vars, "compose-up", port);
    up.wait_ready(Duration::from_secs(90)).await;
    // Ready on its port, and the one answering is ours (not another test's on a reused port).
    assert!(up.running(), "compose's service exited: {}", up.log());
    wait_for(
        "compose's first run processes",
        Duration::from_secs(60),
        || async { env.cursor().await.0 >= ids[1] },
    )
    .await;
    let health = common::http::get(port, "/healthz").await.expect("healthz");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    drop(up);

    vars.remove("MSGX_KAFKA__CE_SOURCE");
    refused(&argv, &vars, "compose-no-source", "kafka.ce_source").await;
    env.cleanup().await;
}

/// The `[Service]` settings of a unit file: (key, value) in order, comments dropped.
fn service_settings(unit: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(common::repo_root().join("packaging").join(unit))
        .unwrap_or_else(|e| panic!("packaging/{unit}: {e}"));
    text.split("\n[Service]\n")
        .nth(1)
        .expect("[Service]")
        .split("\n[")
        .next()
        .expect("section")
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// The package's file installed at `dest` (cargo-deb's assets in actors/Cargo.toml).
fn deb_asset(dest: &str) -> PathBuf {
    let manifest = toml_file(&common::repo_root().join("actors/Cargo.toml"));
    let deb = &manifest["package"]["metadata"]["deb"];
    let assets = deb["assets"].as_array().expect("assets");
    let src = assets
        .iter()
        .find(|a| a[1].as_str() == Some(dest))
        .and_then(|a| a[0].as_str())
        .unwrap_or_else(|| panic!("the package installs {dest}"));
    common::repo_root().join("actors").join(src)
}

/// The systemd environment of instance `name`: the unit's `Environment=` and
/// `EnvironmentFile=` (a `-` one may be missing), with `%i` = `name` and /etc/msgexchange/ at
/// `etc`; and its ExecStart.
fn instance_env(
    unit: &[(String, String)],
    name: &str,
    etc: &Path,
) -> (BTreeMap<String, String>, Vec<String>) {
    let expand = |v: &str| {
        v.replace("%i", name)
            .replace("/etc/msgexchange/", &format!("{}/", etc.display()))
    };
    let mut env = BTreeMap::new();
    let mut exec = Vec::new();
    for (k, v) in unit {
        match k.as_str() {
            "Environment" => {
                let (var, value) = v.split_once('=').expect("Environment=VAR=value");
                env.insert(var.to_string(), expand(value));
            }
            "EnvironmentFile" => {
                let (optional, path) = v
                    .strip_prefix('-')
                    .map_or((false, v.as_str()), |p| (true, p));
                let Ok(text) = std::fs::read_to_string(expand(path)) else {
                    assert!(optional, "EnvironmentFile={v} is missing");
                    continue;
                };
                for line in text.lines().map(str::trim) {
                    if let Some((var, value)) =
                        line.split_once('=').filter(|_| !line.starts_with('#'))
                    {
                        env.insert(var.to_string(), value.trim_matches('"').to_string());
                    }
                }
            }
            "ExecStart" => exec = expand(v).split_whitespace().map(str::to_string).collect(),
            _ => {}
        }
    }
    (env, exec)
}

/// Issue 55: a host relaying several inboxes runs msgexchange@.service once per inbox. The
/// template (shipped by the package: cargo-deb installs every `msgexchange@.service` of its
/// unit-scripts directory) keeps msgexchange.service's settings but the instance's own
/// configuration and secrets; two instances, each configured from the packaged
/// msgexchange.toml (TLS verified as packaged, against the test CA) with its own ce_source,
/// store (so lease), inbox and port, run side by side and each delivers under its own source.
#[tokio::test]
async fn two_template_instances_run_side_by_side_from_the_packaged_files() {
    let ca = Path::new("/var/lib/msgx-test-tls/ca.crt");
    if !ca.is_file() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "no {} (scripts/services.sh sets the servers up for TLS)",
            ca.display()
        );
        eprintln!("SKIP: no {} (run scripts/services.sh)", ca.display());
        return;
    }
    let manifest = toml_file(&common::repo_root().join("actors/Cargo.toml"));
    let units = &manifest["package"]["metadata"]["deb"]["systemd-units"];
    assert_eq!(units["unit-name"].as_str(), Some("msgexchange"));
    assert_eq!(units["unit-scripts"].as_str(), Some("../packaging/"));
    let template = service_settings("msgexchange@.service");
    // Everything but the instance's config, secrets and credentials is the single unit's.
    let shared = |s: &[(String, String)]| -> Vec<(String, String)> {
        let own = ["Environment", "EnvironmentFile", "LoadCredential"];
        s.iter()
            .filter(|(k, _)| !own.contains(&k.as_str()))
            .cloned()
            .collect()
    };
    assert_eq!(
        shared(&template),
        shared(&service_settings("msgexchange.service"))
    );
    assert!(deb_asset("usr/bin/").ends_with("target/release/msgexchange"));
    let packaged = toml_file(&deb_asset("etc/msgexchange/msgexchange.toml"));

    let etc = std::env::temp_dir().join(format!("msgxt_units_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&etc);
    std::fs::create_dir_all(&etc).expect("etc dir");
    let (topic, dlq) = ("msgx.flight-events", "msgx.flight-events.dlq");
    let mock = RawMock::new(1, &[(topic, 6), (dlq, 6)]);
    let mut running = Vec::new();
    for name in ["north", "south"] {
        let env = TestEnv::new(&format!("unit_{name}")).await;
        let port = free_port();
        // What the site writes: /etc/msgexchange/NAME.toml from the packaged file, and the
        // store URL (with a password, elsewhere) in NAME.env.
        let mut t = packaged.clone();
        let set = |t: &mut toml::Table, section: &str, key: &str, v: &str| {
            let s = t
                .get_mut(section)
                .and_then(|s| s.as_table_mut())
                .expect(section);
            s.insert(key.into(), toml::Value::String(v.into()));
        };
        let ca = ca.display().to_string();
        set(&mut t, "inbox", "url", &env.my_url);
        set(&mut t, "inbox", "ssl_ca", &ca);
        set(&mut t, "store", "ssl_ca", &ca);
        set(&mut t, "kafka", "brokers", &mock.bootstrap());
        // The mock cluster speaks no TLS (a site's brokers do: "ssl" as packaged).
        set(&mut t, "kafka", "security_protocol", "plaintext");
        set(
            &mut t,
            "kafka",
            "ce_source",
            &format!("//{name}.pek.test/msgexchange"),
        );
        set(&mut t, "http", "listen", &format!("127.0.0.1:{port}"));
        std::fs::write(
            etc.join(format!("{name}.toml")),
            toml::to_string(&t).expect("toml"),
        )
        .expect("instance config");
        std::fs::write(
            etc.join(format!("{name}.env")),
            format!("# secrets\nMSGX_STORE__URL={}\n", env.pg_url),
        )
        .expect("instance env");
        let (vars, exec) = instance_env(&template, name, &etc);
        running.push((start(&exec, &vars, &format!("unit-{name}"), port), env));
    }
    for (n, (svc, env)) in running.iter_mut().enumerate() {
        svc.wait_ready(Duration::from_secs(90)).await;
        assert!(svc.running(), "{} exited: {}", svc.name, svc.log());
        let id = env
            .insert_message(&common::msgs::flop(
                1,
                &format!("CA10{n}"),
                &[("GATE", "A1")],
            ))
            .await;
        wait_for(
            "each instance processes its inbox",
            Duration::from_secs(60),
            || async { env.cursor().await.0 >= id },
        )
        .await;
    }
    let sources: std::collections::BTreeSet<String> =
        common::kafka::consume(&mock.bootstrap(), topic, 6, 2)
            .into_iter()
            .filter_map(|r| r.headers.get("ce_source").cloned())
            .collect();
    assert_eq!(
        sources.into_iter().collect::<Vec<_>>(),
        [
            "//north.pek.test/msgexchange",
            "//south.pek.test/msgexchange"
        ],
        "each instance delivers under its own ce_source"
    );
    for (svc, env) in running {
        drop(svc);
        env.cleanup().await;
    }
    let _ = std::fs::remove_dir_all(&etc);
}
