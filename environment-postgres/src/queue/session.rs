//! The pool's connections, each with the statements it has prepared: a statement is parsed
//! once per connection, and every later use is one round trip instead of two.

use std::collections::HashMap;

use postgres::types::ToSql;
use postgres::{Client, GenericClient, Row, Statement};

use crate::server::Server;

use super::Ctx;

/// A connection and its prepared statements, by their text.
pub(crate) struct Session {
    pub client: Client,
    pub statements: HashMap<&'static str, Statement>,
}

/// Opens [`Session`]s for the pool.
#[derive(Debug)]
pub(crate) struct Sessions {
    pub server: Server,
}

impl r2d2::ManageConnection for Sessions {
    type Connection = Session;
    type Error = postgres::Error;

    fn connect(&self) -> Result<Session, postgres::Error> {
        Ok(Session {
            client: self.server.connect()?,
            statements: HashMap::new(),
        })
    }

    fn is_valid(&self, session: &mut Session) -> Result<(), postgres::Error> {
        session.client.simple_query("").map(drop)
    }

    fn has_broken(&self, session: &mut Session) -> bool {
        session.client.is_closed()
    }
}

type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// The statement `sql`, prepared on this connection once (statements outlive transactions,
/// rolled back or not).
fn prepared(
    client: &mut impl GenericClient,
    statements: &mut HashMap<&'static str, Statement>,
    sql: &'static str,
) -> Result<Statement, postgres::Error> {
    if let Some(s) = statements.get(sql) {
        return Ok(s.clone());
    }
    let s = client.prepare(sql)?;
    statements.insert(sql, s.clone());
    Ok(s)
}

/// Runs statements prepared once per connection: in a transaction ([`Ctx`]), or on a bare
/// session, where one statement is a transaction of its own.
pub(crate) trait Statements {
    fn execute(&mut self, sql: &'static str, params: Params<'_>) -> Result<u64, postgres::Error>;
    fn query(&mut self, sql: &'static str, params: Params<'_>)
    -> Result<Vec<Row>, postgres::Error>;
    fn query_one(&mut self, sql: &'static str, params: Params<'_>) -> Result<Row, postgres::Error>;

    /// The first row, if any (the statements that use it find at most one).
    fn query_opt(
        &mut self,
        sql: &'static str,
        params: Params<'_>,
    ) -> Result<Option<Row>, postgres::Error> {
        Ok(self.query(sql, params)?.into_iter().next())
    }
}

/// The three ways a statement runs, the same on a transaction and on a session: `$client`
/// and `$statements` are the places of the connection and its statements in `$this`.
macro_rules! statements {
    ($this:ident => $client:expr, $statements:expr) => {
        fn execute(
            &mut self,
            sql: &'static str,
            params: Params<'_>,
        ) -> Result<u64, postgres::Error> {
            let $this = self;
            let s = prepared(&mut $client, &mut $statements, sql)?;
            $client.execute(&s, params)
        }

        fn query(
            &mut self,
            sql: &'static str,
            params: Params<'_>,
        ) -> Result<Vec<Row>, postgres::Error> {
            let $this = self;
            let s = prepared(&mut $client, &mut $statements, sql)?;
            $client.query(&s, params)
        }

        fn query_one(
            &mut self,
            sql: &'static str,
            params: Params<'_>,
        ) -> Result<Row, postgres::Error> {
            let $this = self;
            let s = prepared(&mut $client, &mut $statements, sql)?;
            $client.query_one(&s, params)
        }
    };
}

impl Statements for Session {
    statements!(this => this.client, this.statements);
}

impl Statements for Ctx<'_, '_> {
    statements!(this => *this.tx, *this.statements);
}
