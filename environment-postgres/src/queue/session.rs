//! The pool's connections, each with the statements it has prepared (see
//! [`crate::statements`]).

use std::collections::HashMap;

use postgres::{Client, Statement};

use crate::server::Server;
use crate::statements::{Statements, statements};

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

impl Statements for Session {
    statements!(this => this.client, this.statements);
}

impl Statements for Ctx<'_, '_> {
    statements!(this => *this.tx, *this.statements);
}
