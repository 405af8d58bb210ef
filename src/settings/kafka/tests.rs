//! Unit tests of `[kafka]`: valid settings pass and secrets never print, each bad value names
//! its key, `extra` cannot weaken the delivery guarantee, the transactional id's default.

use super::*;

fn base() -> KafkaSettings {
    KafkaSettings {
        brokers: "k1:9092,k2:9092".into(),
        topic: "flight-events".into(),
        dlq_topic: "flight-events.dlq".into(),
        client_id: "msgexchange".into(),
        ce_source: "/msgexchange".into(),
        linger: Duration::from_millis(5),
        batch_bytes: 1_000_000,
        compression: "lz4".into(),
        delivery_timeout: Duration::from_secs(30),
        request_timeout: Duration::from_secs(10),
        security_protocol: "sasl_ssl".into(),
        sasl_mechanism: "SCRAM-SHA-512".into(),
        sasl_username: "msgx".into(),
        sasl_password: "hunter2".into(),
        ssl_ca_location: String::new(),
        extra: "ssl.key.password=topsecret; socket.keepalive.enable=true".into(),
        delivery: Delivery::AtLeastOnce,
        transactional_id: String::new(),
        transaction_timeout: Duration::from_secs(60),
        open_transaction_wait: Duration::from_secs(900),
    }
}

#[test]
fn valid_settings_pass_and_secrets_never_print() {
    let k = base();
    k.validate().expect("valid");
    let shown = format!("{k:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(!shown.contains("topsecret"), "{shown}");
    assert!(shown.contains("socket.keepalive.enable=true"), "{shown}");
    assert_eq!(k.extra_pairs().expect("pairs").len(), 2);
}

type Mutation = Box<dyn Fn(&mut KafkaSettings)>;

#[test]
fn each_bad_value_names_its_key() {
    let cases: Vec<(&str, Mutation)> = vec![
        ("kafka.brokers", Box::new(|k| k.brokers = "k1".into())),
        // An empty kafka.brokers passes here: `run` refuses it (actors' first_start), the
        // operator commands need no broker.
        ("kafka.topic", Box::new(|k| k.topic = "bad topic".into())),
        (
            "kafka.dlq_topic",
            Box::new(|k| k.dlq_topic = k.topic.clone()),
        ),
        (
            "kafka.compression",
            Box::new(|k| k.compression = "brotli".into()),
        ),
        (
            "kafka.security_protocol",
            Box::new(|k| k.security_protocol = "tls".into()),
        ),
        (
            "kafka.sasl_mechanism",
            Box::new(|k| k.sasl_mechanism = "GSSAPI".into()),
        ),
        (
            "kafka.extra",
            Box::new(|k| k.extra = "ssl.key.password".into()),
        ),
        (
            "kafka.request_timeout",
            Box::new(|k| k.request_timeout = Duration::from_secs(60)),
        ),
        (
            "kafka.transaction_timeout",
            Box::new(|k| {
                k.delivery = Delivery::ExactlyOnce;
                k.transaction_timeout = Duration::from_secs(10);
            }),
        ),
    ];
    for (key, mutate) in cases {
        let mut k = base();
        mutate(&mut k);
        let err = k.validate().expect_err(key).to_string();
        assert!(err.contains(key), "{key}: {err}");
        assert!(!err.contains("topsecret"), "{err}");
    }
}

#[test]
fn extra_may_not_weaken_the_delivery_guarantee() {
    for bad in [
        "enable.idempotence=false",
        "acks=1",
        "socket.keepalive.enable=true; ACKS=0",
        "request.required.acks=1",
        "max.in.flight.requests.per.connection=100",
        "partitioner=random",
        "isolation.level=read_uncommitted",
        "enable.auto.commit=true",
        "group.id=mine",
        "auto.offset.reset=latest",
    ] {
        let mut k = base();
        k.extra = bad.into();
        let err = k.validate().expect_err(bad).to_string();
        assert!(err.contains("kafka.extra"), "{bad}: {err}");
        assert!(err.contains("may not be set"), "{bad}: {err}");
    }
}

/// Issue 55: TLS has its own keys (read by the start-up TLS check); `extra` cannot override
/// them, nor turn the certificate or host-name check off, in any case of the key.
#[test]
fn extra_may_not_weaken_tls() {
    for bad in [
        "security.protocol=plaintext",
        "Security.Protocol=sasl_plaintext",
        "enable.ssl.certificate.verification=false",
        "ssl.endpoint.identification.algorithm=none",
        "socket.keepalive.enable=true; ssl.ca.location=/tmp/mine.pem",
        "sasl.mechanism=PLAIN",
        "sasl.mechanisms=PLAIN",
        "sasl.username=other",
        "sasl.password=topsecret",
    ] {
        let mut k = base();
        k.extra = bad.into();
        let err = k.validate().expect_err(bad).to_string();
        assert!(err.contains("kafka.extra"), "{bad}: {err}");
        assert!(err.contains("may not be set"), "{bad}: {err}");
        assert!(!err.contains("topsecret"), "{err}");
    }
    let mut k = base();
    k.extra =
        "ssl.certificate.location=/etc/msgx/client.pem;ssl.key.location=/etc/msgx/k.pem".into();
    k.validate()
        .expect("a client certificate is still the site's to give");
}

#[test]
fn the_transactional_id_defaults_to_client_and_topic() {
    let mut k = base();
    assert!(!k.exactly_once(), "at-least-once is the default");
    assert_eq!(k.transactional_id(), "msgexchange.flight-events");
    k.transactional_id = " site-a ".into();
    assert_eq!(k.transactional_id(), "site-a");
}

#[test]
fn embedded_needs_no_port() {
    let mut k = base();
    k.brokers = "embedded".into();
    k.validate().expect("embedded is valid");
    assert!(k.is_embedded());
}
