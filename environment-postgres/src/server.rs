//! Where the server is and how a connection reaches it: the parsed connection string, and TLS.
//!
//! A connection over TCP is encrypted: `sslmode=prefer` (the default) is taken as `require`,
//! since a machine in the middle could otherwise just decline TLS and be spoken to in clear.
//! The server's certificate is checked, name and chain, against the CA certificates in
//! [`PgQueueConfig::ca_file`](crate::PgQueueConfig) (libpq's `PGSSLROOTCERT` by default;
//! `system` names the system's roots, as in libpq) or else the system's roots, so a server
//! nothing trusted vouches for is refused. Only an explicit `sslmode=disable` speaks in clear,
//! for a trusted network; a Unix socket is never encrypted. Passwords come from the connection
//! string as given; the stores never log or return them.

use std::path::Path;
use std::sync::Arc;

use postgres::Client;
use postgres::config::SslMode;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::error::{PgError, Result};

/// A server and the TLS its connections use.
#[derive(Clone)]
pub(crate) struct Server {
    pub config: postgres::Config,
    tls: MakeRustlsConnect,
}

/// The configuration's own `Debug` leaves the password out.
impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// The server `config` names, its certificate checked against `ca_file`'s certificates or
    /// the system's roots.
    pub fn new(mut config: postgres::Config, ca_file: Option<&Path>) -> Result<Server> {
        let tcp = config
            .get_hosts()
            .iter()
            .any(|h| matches!(h, postgres::config::Host::Tcp(_)));
        if tcp && config.get_ssl_mode() == SslMode::Prefer {
            config.ssl_mode(SslMode::Require);
        }
        let roots = roots(ca_file.filter(|p| *p != Path::new("system")))?;
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| PgError::Tls(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Server {
            config,
            tls: MakeRustlsConnect::new(tls),
        })
    }

    /// A new connection.
    pub fn connect(&self) -> std::result::Result<Client, postgres::Error> {
        self.config.connect(self.tls.clone())
    }

    /// The same server under another `application_name`.
    pub fn named(&self, name: &str) -> Server {
        let mut s = self.clone();
        s.config.application_name(name);
        s
    }
}

/// The certificates a server's must chain to.
fn roots(ca_file: Option<&Path>) -> Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let bad = |e: &dyn std::fmt::Display| {
                PgError::Tls(format!("the CA certificates in {}: {e}", path.display()))
            };
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .map_err(|e| bad(&e))?
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| bad(&e))?;
            if certs.is_empty() {
                return Err(bad(&"no certificate in the file"));
            }
            for cert in certs {
                roots.add(cert).map_err(|e| bad(&e))?;
            }
        }
        None => {
            // Certificates the system has that rustls cannot use are skipped, as browsers do;
            // a system with none it can use is said so, not left to fail every handshake.
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                let why: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
                return Err(PgError::Tls(format!(
                    "this system has no CA certificate to check servers with ({}): name a CA \
                     file (PGSSLROOTCERT)",
                    why.join("; ")
                )));
            }
        }
    }
    Ok(roots)
}
