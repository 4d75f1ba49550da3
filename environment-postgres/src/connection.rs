//! [`Session`]: the one connection of a store whose work is small and rare (the policy, the
//! effect log), opened again when the server ended it, with its statements prepared once.
//!
//! The ports are blocking, and they are called from async tasks too, where the blocking client
//! refuses to run: there, a call runs on a thread of its own; elsewhere on the caller's.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use postgres::{Client, IsolationLevel, Statement, Transaction};

use crate::error::{PgContext, PgError, Result, session_ended};
use crate::migrate::{Migration, migrate};
use crate::server::Server;
use crate::statements::{Statements, statements};

/// How a store that keeps one connection ([`PgPolicyStore`](crate::PgPolicyStore),
/// [`PgEffectStore`](crate::PgEffectStore)) connects.
#[derive(Clone, Debug)]
pub struct PgStoreConfig {
    /// The CA certificates (PEM) a TLS server's certificate must chain to; `None`: the
    /// system's roots. By default libpq's `PGSSLROOTCERT`, when set; a connection string's
    /// `sslrootcert` takes its place ([`PgStoreConfig::reading`]).
    pub ca_file: Option<PathBuf>,
    /// The `application_name` of the store's session (`pg_stat_activity` shows it).
    pub application_name: String,
    /// How long connecting may take before the store reports the server unavailable.
    pub connect_timeout: Duration,
}

impl PgStoreConfig {
    /// This configuration with the CA file a connection string named, if it named one.
    pub fn reading(mut self, ca_file: Option<PathBuf>) -> PgStoreConfig {
        if ca_file.is_some() {
            self.ca_file = ca_file;
        }
        self
    }
}

impl Default for PgStoreConfig {
    fn default() -> PgStoreConfig {
        PgStoreConfig {
            ca_file: std::env::var_os("PGSSLROOTCERT").map(Into::into),
            application_name: "environment".into(),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// One connection to the server, opened again after one that broke, with its prepared
/// statements.
pub(crate) struct Session {
    server: Server,
    client: Option<Client>,
    statements: HashMap<&'static str, Statement>,
}

/// Closing the connection blocks on it too: off the runtime, as every call.
impl Drop for Session {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            self.statements.clear();
            let _ = off_the_runtime(|| {
                drop(client);
                Ok(())
            });
        }
    }
}

/// A transaction of the session, with its statements.
pub(crate) struct Tx<'t, 'c> {
    tx: &'t mut Transaction<'c>,
    statements: &'t mut HashMap<&'static str, Statement>,
}

impl Statements for Tx<'_, '_> {
    statements!(this => *this.tx, *this.statements);
}

impl Session {
    /// A session on `server`, with `component`'s schema brought up to date.
    pub(crate) fn open(
        mut server: postgres::Config,
        config: &PgStoreConfig,
        component: &str,
        migrations: &[Migration],
    ) -> Result<Session> {
        server.application_name(&config.application_name);
        server.connect_timeout(config.connect_timeout);
        let server = Server::new(server, config.ca_file.as_deref())?;
        let mut session = Session {
            server,
            client: None,
            statements: HashMap::new(),
        };
        off_the_runtime(|| migrate(session.client()?, component, migrations))?;
        Ok(session)
    }

    /// Runs `work` on the session, off an async runtime (see [`off_the_runtime`]).
    pub(crate) fn call<T: Send>(
        &mut self,
        work: impl FnOnce(&mut Session) -> Result<T> + Send,
    ) -> Result<T> {
        off_the_runtime(|| work(self))
    }

    pub(crate) fn client(&mut self) -> Result<&mut Client> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.drop_client();
            let client = self
                .server
                .connect()
                .map_err(|e| PgError::Unreachable(crate::error::describe(&e)))?;
            self.client = Some(client);
        }
        self.client
            .as_mut()
            .ok_or_else(|| PgError::Unreachable("no connection".into()))
    }

    /// The connection (opened if need be) and its statements.
    fn parts(&mut self) -> Result<(&mut Client, &mut HashMap<&'static str, Statement>)> {
        self.client()?;
        match self {
            Session {
                client: Some(client),
                statements,
                ..
            } => Ok((client, statements)),
            _ => Err(PgError::Unreachable("no connection".into())),
        }
    }

    /// Forgets the connection, and the statements prepared on it.
    fn drop_client(&mut self) {
        self.client = None;
        self.statements.clear();
    }

    /// Runs one statement that reads, as a transaction of its own; again on a new connection
    /// if the server had ended the session (a read is safe to run twice).
    pub(crate) fn read(
        &mut self,
        sql: &'static str,
        params: crate::statements::Params<'_>,
    ) -> Result<Vec<postgres::Row>> {
        self.statement(sql, params, 2)
    }

    /// Runs one statement that writes, as a transaction of its own. Not run again when the
    /// session ends: whether it committed then is not known, and the caller is told so.
    pub(crate) fn write(
        &mut self,
        sql: &'static str,
        params: crate::statements::Params<'_>,
    ) -> Result<Vec<postgres::Row>> {
        self.statement(sql, params, 1)
    }

    fn statement(
        &mut self,
        sql: &'static str,
        params: crate::statements::Params<'_>,
        tries: u32,
    ) -> Result<Vec<postgres::Row>> {
        let mut tried = 0;
        loop {
            tried += 1;
            let (client, statements) = self.parts()?;
            let done = crate::statements::prepared(client, statements, sql)
                .and_then(|s| client.query(&s, params));
            match done {
                Err(e) if session_ended(&e) => {
                    self.drop_client();
                    if tried >= tries {
                        return Err(e).ctx("running a statement");
                    }
                }
                done => return done.ctx("running a statement"),
            }
        }
    }

    /// Runs `work` in a transaction at `level`, run again when it loses a serialization
    /// conflict or when the server had ended the session while it was idle (nothing was sent
    /// then); a session that ends later is dropped, to be opened again by the next call.
    pub(crate) fn run<T>(
        &mut self,
        level: IsolationLevel,
        mut work: impl FnMut(&mut Tx<'_, '_>) -> Result<T>,
    ) -> Result<T> {
        let mut tries = 0;
        loop {
            tries += 1;
            let (client, statements) = self.parts()?;
            match attempt(client, statements, level, &mut work) {
                Err(Unstarted(e)) if session_ended(&e) && tries < 8 => self.drop_client(),
                Err(Unstarted(e)) => return Err(e).ctx("starting a transaction"),
                Ok(Err(e)) if e.retryable() && tries < 8 => {}
                Ok(Err(e)) => {
                    if let PgError::Postgres { source, .. } = &e
                        && session_ended(source)
                    {
                        self.drop_client();
                    }
                    return Err(e);
                }
                Ok(done) => return done,
            }
        }
    }
}

/// A transaction that could not begin.
struct Unstarted(postgres::Error);

fn attempt<T>(
    client: &mut Client,
    statements: &mut HashMap<&'static str, Statement>,
    level: IsolationLevel,
    work: &mut impl FnMut(&mut Tx<'_, '_>) -> Result<T>,
) -> std::result::Result<Result<T>, Unstarted> {
    let mut tx = client
        .build_transaction()
        .isolation_level(level)
        .start()
        .map_err(Unstarted)?;
    let out = work(&mut Tx {
        tx: &mut tx,
        statements,
    });
    Ok(out.and_then(|out| tx.commit().ctx("committing").map(|()| out)))
}

/// Runs `work` on this thread, or on a thread of its own when this one drives an async
/// runtime (the blocking client refuses to run there); a panic there is this thread's.
pub(crate) fn blocking<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    if tokio::runtime::Handle::try_current().is_err() {
        return work();
    }
    match std::thread::scope(|s| s.spawn(work).join()) {
        Ok(done) => done,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// Runs `work` on this thread, or on a thread of its own when this one drives an async
/// runtime: the blocking client refuses to run there.
pub(crate) fn off_the_runtime<T: Send>(work: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    if tokio::runtime::Handle::try_current().is_err() {
        return work();
    }
    std::thread::scope(|s| s.spawn(work).join())
        .unwrap_or_else(|_| Err(PgError::Unreachable("a call to the store panicked".into())))
}
