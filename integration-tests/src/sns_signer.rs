//! A stand-in for SNS's signing: a signing certificate served over HTTPS the way SNS serves
//! its own (`/SimpleNotificationService-<name>.pem`), by `openssl s_server -WWW` on
//! loopback with a certificate from a CA of the test's own, and envelopes signed with its
//! key as SNS signs them (SignatureVersion 1: SHA1withRSA, 2: SHA256withRSA, over the
//! documented canonical fields). Herald reaches it through
//! `reconcile.sns_certificate_endpoint`, which keeps the URL's path.
//!
//! Everything is made with the openssl CLI (the local stack's scripts install it).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use base64::Engine;
use serde_json::{json, Value};

/// The certificate's name in its URL (what SNS calls `SimpleNotificationService-<hash>`).
pub const CERT_NAME: &str = "SimpleNotificationService-heraldstandin";

pub struct SnsSigner {
    dir: PathBuf,
    server: Child,
    /// `https://127.0.0.1:PORT`: Herald's `sns_certificate_endpoint`.
    pub endpoint: String,
    /// The CA that signed the HTTPS server's certificate: `sns_certificate_ca_file`.
    pub ca_file: PathBuf,
    key: PathBuf,
    /// A key whose certificate nobody serves: a forger's.
    pub forger_key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .context("running openssl (the local stack's scripts install it)")?;
    if !out.status.success() {
        bail!(
            "openssl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

impl SnsSigner {
    /// Makes the keys and certificates and starts the HTTPS server; it stops on drop.
    pub fn start(name: &str) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!(
            "herald-sns-{name}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ));
        let www = dir.join("www");
        std::fs::create_dir_all(&www)?;
        let days = ["-days", "2"];
        openssl(
            &dir,
            &[
                &[
                    "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
                ][..],
                &days,
                &["-subj", "/CN=herald-test-sns-ca"],
            ]
            .concat(),
        )?;
        openssl(
            &dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=127.0.0.1",
            ],
        )?;
        std::fs::write(dir.join("server.ext"), "subjectAltName=IP:127.0.0.1\n")?;
        openssl(
            &dir,
            &[
                &[
                    "x509",
                    "-req",
                    "-in",
                    "server.csr",
                    "-CA",
                    "ca.crt",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-out",
                    "server.crt",
                    "-extfile",
                    "server.ext",
                ][..],
                &days,
            ]
            .concat(),
        )?;
        let cert = format!("www/{CERT_NAME}.pem");
        openssl(
            &dir,
            &[
                &[
                    "req",
                    "-x509",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-keyout",
                    "signer.key",
                    "-out",
                    &cert,
                ][..],
                &days,
                &["-subj", "/CN=sns.amazonaws.com"],
            ]
            .concat(),
        )?;
        openssl(&dir, &["genrsa", "-out", "forger.key", "2048"])?;
        // A port picked, then bound by s_server: another process may take it in between,
        // so a server that exits at once is started again on another.
        let mut tries = 0;
        let (server, port) = loop {
            tries += 1;
            let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            let mut server = Command::new("openssl")
                .args(["s_server", "-quiet", "-WWW", "-accept"])
                .arg(format!("127.0.0.1:{port}"))
                .arg("-cert")
                .arg(dir.join("server.crt"))
                .arg("-key")
                .arg(dir.join("server.key"))
                .current_dir(&www)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting openssl s_server")?;
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let listening = loop {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    break true;
                }
                if server.try_wait()?.is_some() || std::time::Instant::now() > deadline {
                    break false;
                }
                std::thread::sleep(Duration::from_millis(50));
            };
            if listening {
                break (server, port);
            }
            let _ = server.kill();
            let _ = server.wait();
            if tries == 5 {
                bail!("openssl s_server did not listen (5 ports tried)");
            }
        };
        let signer = Self {
            endpoint: format!("https://127.0.0.1:{port}"),
            ca_file: dir.join("ca.crt"),
            key: dir.join("signer.key"),
            forger_key: dir.join("forger.key"),
            dir,
            server,
        };
        Ok(signer)
    }

    /// The `SigningCertURL` SNS would give for `region`.
    pub fn cert_url(region: &str) -> String {
        format!("https://sns.{region}.amazonaws.com/{CERT_NAME}.pem")
    }

    /// A notification envelope of `message` from `topic`, signed with the stand-in's key.
    pub fn notification(&self, topic: &str, message: &Value, version: u8) -> Result<Value> {
        let region = topic.split(':').nth(3).unwrap_or_default();
        notification(topic, message, version, &Self::cert_url(region), &self.key)
    }
}

impl Drop for SnsSigner {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A notification envelope of `message` from `topic`, naming `cert_url`, signed with `key`
/// (SignatureVersion `version`).
pub fn notification(topic: &str, message: &Value, version: u8, cert_url: &str, key: &Path) -> Result<Value> {
    let message = message.to_string();
    let id = uuid::Uuid::new_v4().to_string();
    let timestamp = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string();
    let canonical = format!(
        "Message\n{message}\nMessageId\n{id}\nTimestamp\n{timestamp}\nTopicArn\n{topic}\nType\nNotification\n"
    );
    Ok(json!({
        "Type": "Notification",
        "MessageId": id,
        "TopicArn": topic,
        "Message": message,
        "Timestamp": timestamp,
        "SignatureVersion": version.to_string(),
        "Signature": sign(key, version, &canonical)?,
        "SigningCertURL": cert_url,
        "UnsubscribeURL": format!("https://sns.example/?Action=Unsubscribe&SubscriptionArn={topic}:x"),
    }))
}

/// The base64 signature of `text` with `key`: SHA1withRSA (version 1) or SHA256withRSA (2).
pub fn sign(key: &Path, version: u8, text: &str) -> Result<String> {
    use std::io::Write;
    let digest = if version == 1 { "-sha1" } else { "-sha256" };
    let mut child = Command::new("openssl")
        .args(["dgst", digest, "-sign"])
        .arg(key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running openssl dgst")?;
    child
        .stdin
        .take()
        .context("openssl stdin")?
        .write_all(text.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("openssl dgst: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(base64::engine::general_purpose::STANDARD.encode(out.stdout))
}
