//! TLS for every PostgreSQL connection Herald makes (the pool, the migration owner's
//! connection, the relay's LISTEN connection). The URL's `sslmode=require` turns it on;
//! without it (`disable`, or `prefer`, the default, which Herald treats as `disable`) the
//! connection is plain. When TLS is used, the server's certificate is always verified,
//! against `database.tls_ca_file` (a PEM bundle) or else the system's trusted roots, and
//! its name against the URL's host: there is no "encrypt but trust anyone" mode.

use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::{Result, StoreError};

/// The connector for `sslmode=require`, trusting `ca_file` or the system's roots.
pub fn connector(ca_file: Option<&Path>) -> Result<MakeRustlsConnect> {
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .and_then(|it| it.collect::<std::result::Result<_, _>>())
                .map_err(|e| StoreError::Config(format!("database.tls_ca_file {}: {e}", path.display())))?;
            if certs.is_empty() {
                return Err(StoreError::Config(format!(
                    "database.tls_ca_file {}: no certificate in it",
                    path.display()
                )));
            }
            for cert in certs {
                roots.add(cert).map_err(|e| {
                    StoreError::Config(format!("database.tls_ca_file {}: {e}", path.display()))
                })?;
            }
        }
        None => {
            // Unreadable system certificates are skipped; with none at all, a TLS
            // connection fails at the handshake and says the certificate is not trusted.
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
        }
    }
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| StoreError::Config(format!("TLS: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

#[cfg(test)]
mod tests {
    use super::connector;

    #[test]
    fn a_ca_file_that_is_missing_or_holds_no_certificate_is_a_clear_error() {
        let missing = connector(Some(std::path::Path::new("/nonexistent/ca.pem")))
            .err()
            .expect("missing file");
        assert!(
            missing
                .to_string()
                .contains("database.tls_ca_file /nonexistent/ca.pem"),
            "{missing}"
        );
        let dir = std::env::temp_dir().join(format!("herald-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = connector(Some(&empty)).err().expect("no certificate");
        assert!(err.to_string().contains("no certificate"), "{err}");
        assert!(connector(None).is_ok(), "the system roots are optional");
    }
}
