//! Which database holds the broker's state, parsed once from `DATABASE_URL` at start into a
//! [`Database`]: a SQLite file with its `synchronous` setting, or a Postgres URL with its pool's
//! size. Nothing else in the broker looks at the URL's text again; an option of the other backend
//! is simply not carried.

use std::path::PathBuf;

use super::Synchronous;
use crate::error::{Error, Result};

/// How errors name the database setting: by the flag and the variable a person sets it with,
/// whichever command (the broker, `migrate`, `export`, `verify --database`) was given it.
pub const DATABASE_URL_SETTING: &str = "--database-url (DATABASE_URL)";

/// The database the broker runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Database {
    /// One file, served by one broker process.
    Sqlite {
        path: PathBuf,
        synchronous: Synchronous,
    },
    /// Shared by any number of replicas.
    Postgres {
        /// The URL as given (`postgres://` or `postgresql://`, query options included).
        url: String,
        /// The size of this replica's connection pool.
        max_connections: u32,
        /// Whether submits, decisions and cancels share group transactions
        /// (`--postgres-group-commit`; off unless asked for, see docs/benchmarks.md).
        group_commit: bool,
    },
}

impl Database {
    /// `postgres://...` or `postgresql://...` is Postgres; `sqlite://PATH`, `sqlite:PATH` or a
    /// plain path is a SQLite file (a query string after it is ignored). An in-memory SQLite
    /// database is refused: it would lose every call. `synchronous` applies to SQLite only,
    /// `max_connections` to Postgres only.
    pub fn parse(url: &str, synchronous: Synchronous, max_connections: u32) -> Result<Database> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Database::Postgres {
                url: url.to_owned(),
                max_connections,
                group_commit: false,
            });
        }
        let path = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .unwrap_or(url);
        let path = path.split('?').next().unwrap_or(path);
        if path.is_empty() || path.contains(":memory:") {
            return Err(Error::invalid(
                DATABASE_URL_SETTING,
                "must name a SQLite file (an in-memory database would lose every call)",
            ));
        }
        Ok(Database::Sqlite {
            path: PathBuf::from(path),
            synchronous,
        })
    }

    /// A SQLite file with the default (power-safe) settings.
    /// Where the receipt signing key is kept when none is given: beside a SQLite file; for a
    /// database replicas share, nowhere (its operator gives the key).
    pub fn key_home(&self) -> crate::receipts::KeyHome<'_> {
        match self {
            Database::Sqlite { path, .. } => crate::receipts::KeyHome::BesideFile(path),
            Database::Postgres { .. } => crate::receipts::KeyHome::Shared,
        }
    }

    #[cfg(test)]
    pub fn sqlite_file(path: impl AsRef<std::path::Path>) -> Database {
        Database::Sqlite {
            path: path.as_ref().to_owned(),
            synchronous: Synchronous::default(),
        }
    }

    /// Where the state is, for a person reading the start log: the SQLite file's full path, or
    /// the Postgres URL with its password masked.
    pub fn describe(&self) -> String {
        match self {
            Database::Sqlite { path, .. } => std::path::absolute(path)
                .unwrap_or_else(|_| path.clone())
                .display()
                .to_string(),
            Database::Postgres { url, .. } => masked_password(url),
        }
    }

    /// `sqlite` or `postgres`, for logs.
    pub fn backend(&self) -> &'static str {
        match self {
            Database::Sqlite { .. } => "sqlite",
            Database::Postgres { .. } => "postgres",
        }
    }
}

/// `url` with the password of its user-info (`scheme://user:password@host`) replaced by `***`.
fn masked_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((user_info, host)) => {
            let user = user_info.split(':').next().unwrap_or("");
            let password = if user_info.contains(':') { ":***" } else { "" };
            format!("{scheme}://{user}{password}@{host}{tail}")
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_log_names_the_database_without_its_password() {
        let pg = |url: &str| {
            Database::parse(url, Synchronous::default(), 1)
                .unwrap()
                .describe()
        };
        assert_eq!(
            pg("postgres://app:s3cret@db:5432/approvals?sslmode=require"),
            "postgres://app:***@db:5432/approvals?sslmode=require"
        );
        assert_eq!(
            pg("postgres://app@db/approvals"),
            "postgres://app@db/approvals"
        );
        assert_eq!(pg("postgresql://db/approvals"), "postgresql://db/approvals");
        let file = Database::sqlite_file("approvals.db").describe();
        assert!(std::path::Path::new(&file).is_absolute(), "{file}");
        assert!(file.ends_with("/approvals.db"), "{file}");
    }

    fn parse(url: &str) -> Result<Database> {
        Database::parse(url, Synchronous::Normal, 7)
    }

    #[test]
    fn postgres_urls_keep_their_text_and_the_pool_size() {
        for url in [
            "postgres://u@h:5432/db?sslmode=require",
            "postgresql://u@h/db",
        ] {
            assert_eq!(
                parse(url).unwrap(),
                Database::Postgres {
                    url: url.into(),
                    max_connections: 7,
                    group_commit: false,
                }
            );
        }
    }

    #[test]
    fn sqlite_urls_and_plain_paths_name_the_file() {
        for url in [
            "sqlite:///tmp/a.db",
            "sqlite:/tmp/a.db",
            "/tmp/a.db",
            "sqlite:///tmp/a.db?mode=rwc",
        ] {
            assert_eq!(
                parse(url).unwrap(),
                Database::Sqlite {
                    path: "/tmp/a.db".into(),
                    synchronous: Synchronous::Normal
                },
                "{url}"
            );
        }
        assert_eq!(
            parse("sqlite://approvals.db").unwrap(),
            Database::Sqlite {
                path: "approvals.db".into(),
                synchronous: Synchronous::Normal
            }
        );
    }

    #[test]
    fn an_in_memory_or_empty_sqlite_database_is_refused_naming_the_setting() {
        for url in ["sqlite::memory:", "sqlite://:memory:", "sqlite://", ""] {
            let err = parse(url).expect_err(url);
            assert!(
                err.to_string().contains("--database-url (DATABASE_URL)"),
                "{url}: {err}"
            );
        }
    }
}
