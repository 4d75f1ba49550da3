//! Connection strings as libpq reads them, `sslrootcert` included: the client library parses
//! the rest but refuses that key, and leaves the certificates to its caller; here they are the
//! CA file the server's certificate is checked against, as with psql.

use std::path::PathBuf;

use crate::error::{PgError, Result};

/// A connection string read: the server, and the CA certificates its `sslrootcert` names.
#[derive(Clone, Debug)]
pub struct ServerAddress {
    /// The server and the session's settings.
    pub config: postgres::Config,
    /// The CA file named by `sslrootcert` (`system`: the system's roots), if the string names
    /// one; it takes the place of `PGSSLROOTCERT`, as in libpq.
    pub ca_file: Option<PathBuf>,
}

impl ServerAddress {
    /// Reads a libpq connection string (`host=… user=… dbname=…`) or a `postgresql://` URL.
    /// A string that does not parse is refused without being echoed (it may hold a secret).
    ///
    /// ```
    /// use environment_postgres::ServerAddress;
    ///
    /// let a = ServerAddress::parse("host=db.internal user=env sslrootcert='/etc/ssl/our ca.pem'")?;
    /// assert_eq!(a.ca_file.unwrap().to_str(), Some("/etc/ssl/our ca.pem"));
    /// assert_eq!(a.config.get_user(), Some("env"));
    /// # Ok::<(), environment_postgres::PgError>(())
    /// ```
    pub fn parse(text: &str) -> Result<ServerAddress> {
        let (rest, ca_file) =
            if text.starts_with("postgres://") || text.starts_with("postgresql://") {
                from_url(text)?
            } else {
                from_pairs(text)?
            };
        let config = rest
            .parse()
            .map_err(|e: postgres::Error| PgError::BadAddress(e.to_string()))?;
        Ok(ServerAddress {
            config,
            ca_file: ca_file.map(PathBuf::from),
        })
    }
}

const KEY: &str = "sslrootcert";

/// The URL without its `sslrootcert` parameter, and that parameter decoded.
fn from_url(text: &str) -> Result<(String, Option<String>)> {
    let Some((base, query)) = text.split_once('?') else {
        return Ok((text.to_owned(), None));
    };
    let mut kept = Vec::new();
    let mut found = None;
    for pair in query.split('&') {
        match pair.split_once('=') {
            Some((KEY, value)) => {
                let value = percent_encoding::percent_decode_str(value)
                    .decode_utf8()
                    .map_err(|_| PgError::BadAddress(format!("{KEY} is not UTF-8")))?;
                found = Some(value.into_owned());
            }
            _ => kept.push(pair),
        }
    }
    let rest = match kept.is_empty() {
        true => base.to_owned(),
        false => format!("{base}?{}", kept.join("&")),
    };
    Ok((rest, found))
}

/// The `key=value` string without its `sslrootcert` pair, and that pair's value unquoted.
fn from_pairs(text: &str) -> Result<(String, Option<String>)> {
    let bytes = text.as_bytes();
    let bad = |what: &str| PgError::BadAddress(what.to_owned());
    let mut rest = String::with_capacity(text.len());
    let mut found = None;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_whitespace() {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && bytes[i] != b'=' && !bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let key = &text[start..i];
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        if i == bytes.len() || bytes[i] != b'=' {
            return Err(bad("a setting without `=`"));
        }
        i += 1;
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        // The value: quoted (spaces allowed, `\'` and `\\` escaped) or up to a space.
        let mut value = String::new();
        if bytes.get(i) == Some(&b'\'') {
            i += 1;
            loop {
                match bytes.get(i) {
                    None => return Err(bad("an unterminated quoted value")),
                    Some(b'\'') => {
                        i += 1;
                        break;
                    }
                    Some(b'\\') if i + 1 < bytes.len() => {
                        value.push(char::from(bytes[i + 1]));
                        i += 2;
                    }
                    Some(_) => {
                        let c = text[i..].chars().next().unwrap_or_default();
                        value.push(c);
                        i += c.len_utf8();
                    }
                }
            }
        } else {
            while i < bytes.len() && !bytes[i].is_ascii_whitespace() {
                if bytes[i] == b'\\' && i + 1 < bytes.len() {
                    i += 1;
                }
                let c = text[i..].chars().next().unwrap_or_default();
                value.push(c);
                i += c.len_utf8();
            }
        }
        if key == KEY {
            found = Some(value);
        } else {
            if !rest.is_empty() {
                rest.push(' ');
            }
            rest.push_str(&text[start..i]);
        }
    }
    Ok((rest, found))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> (String, Option<String>) {
        let a = ServerAddress::parse(text).unwrap();
        (
            format!("{:?}", a.config.get_hosts()),
            a.ca_file.map(|p| p.display().to_string()),
        )
    }

    #[test]
    fn sslrootcert_is_taken_out_of_either_form() {
        for (text, ca) in [
            ("host=db user=env", None),
            (
                "host=db sslrootcert=/etc/ca.pem user=env",
                Some("/etc/ca.pem"),
            ),
            (
                "host = db sslrootcert = '/my certs/ca\\'s.pem'",
                Some("/my certs/ca's.pem"),
            ),
            ("sslrootcert=system host=db", Some("system")),
            ("postgresql://env@db/env", None),
            (
                "postgresql://env@db/env?sslmode=require&sslrootcert=%2Fmy%20certs%2Fca.pem",
                Some("/my certs/ca.pem"),
            ),
            ("postgres://db/env?sslrootcert=/ca.pem", Some("/ca.pem")),
        ] {
            let (hosts, found) = read(text);
            assert!(hosts.contains("db"), "{text}: {hosts}");
            assert_eq!(found.as_deref(), ca, "{text}");
        }
        let a = ServerAddress::parse("host=db sslrootcert=/ca.pem application_name='a b'").unwrap();
        assert_eq!(a.config.get_application_name(), Some("a b"));
        let a = ServerAddress::parse("postgresql://db/env?sslrootcert=/ca.pem&sslmode=require")
            .unwrap();
        assert_eq!(a.config.get_ssl_mode(), postgres::config::SslMode::Require);
    }

    #[test]
    fn a_malformed_string_is_refused() {
        for text in [
            "host=db sslrootcert='/unterminated",
            "host",
            "host=db nosuchkey=1",
            "postgresql://db/env?sslrootcert=%FF",
        ] {
            assert!(
                matches!(ServerAddress::parse(text), Err(PgError::BadAddress(_))),
                "{text}"
            );
        }
    }
}
