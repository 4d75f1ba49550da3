//! Statements prepared once per connection: a statement is parsed once, and every later use
//! is one round trip instead of two (parse and describe, then bind and execute).

use std::collections::HashMap;

use postgres::types::ToSql;
use postgres::{GenericClient, Row, Statement};

pub(crate) type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// The statement `sql`, prepared on this connection once (statements outlive transactions,
/// rolled back or not).
pub(crate) fn prepared(
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
            params: $crate::statements::Params<'_>,
        ) -> ::std::result::Result<u64, postgres::Error> {
            let $this = self;
            let s = $crate::statements::prepared(&mut $client, &mut $statements, sql)?;
            $client.execute(&s, params)
        }

        fn query(
            &mut self,
            sql: &'static str,
            params: $crate::statements::Params<'_>,
        ) -> ::std::result::Result<Vec<postgres::Row>, postgres::Error> {
            let $this = self;
            let s = $crate::statements::prepared(&mut $client, &mut $statements, sql)?;
            $client.query(&s, params)
        }

        fn query_one(
            &mut self,
            sql: &'static str,
            params: $crate::statements::Params<'_>,
        ) -> ::std::result::Result<postgres::Row, postgres::Error> {
            let $this = self;
            let s = $crate::statements::prepared(&mut $client, &mut $statements, sql)?;
            $client.query_one(&s, params)
        }
    };
}

pub(crate) use statements;
