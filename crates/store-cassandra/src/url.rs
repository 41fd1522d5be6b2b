//! `cassandra://host:port[,host:port...]/keyspace?replication=N`.

use tarn_store::{StoreError, StoreResult};

/// The CQL port when a host names none.
const DEFAULT_PORT: u16 = 9042;

/// What a `cassandra://` URL names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    /// Contact points, `host:port`; the driver discovers the other nodes.
    pub hosts: Vec<String>,
    /// The keyspace holding Tarn's table.
    pub keyspace: String,
    /// Replication factor used when the keyspace has to be created.
    pub replication: u32,
}

fn invalid(msg: impl Into<String>) -> StoreError {
    StoreError::Invalid(format!("Cassandra URL: {}", msg.into()))
}

/// Parses a store URL. Only `replication` is accepted as a parameter, so a
/// misspelt one is refused rather than ignored.
pub(crate) fn parse(url: &str) -> StoreResult<Target> {
    let rest = url
        .strip_prefix("cassandra://")
        .ok_or_else(|| invalid("it starts with cassandra://"))?;
    let (authority, rest) = rest
        .split_once('/')
        .ok_or_else(|| invalid("it names a keyspace: cassandra://host:port/keyspace"))?;
    // Never echoed: it would show a password in errors and logs.
    if authority.contains('@') {
        return Err(invalid(
            "it names no user or password: cassandra://host:port/keyspace",
        ));
    }
    let (keyspace, query) = match rest.split_once('?') {
        Some((k, q)) => (k, Some(q)),
        None => (rest, None),
    };
    let mut hosts = Vec::new();
    for h in authority.split(',') {
        if h.is_empty() {
            return Err(invalid("an empty host"));
        }
        let with_port = match h.rsplit_once(':') {
            // An IPv6 literal is bracketed: [::1]:9042.
            Some((host, port)) if !host.is_empty() && !port.contains(']') => {
                port.parse::<u16>()
                    .map_err(|_| invalid(format!("port of {h:?}")))?;
                h.to_string()
            }
            _ => format!("{h}:{DEFAULT_PORT}"),
        };
        hosts.push(with_port);
    }
    check_keyspace(keyspace)?;
    let mut replication = 3;
    for kv in query.into_iter().flat_map(|q| q.split('&')) {
        match kv.split_once('=') {
            Some(("replication", n)) => {
                replication = n
                    .parse::<u32>()
                    .ok()
                    .filter(|n| (1..=32).contains(n))
                    .ok_or_else(|| invalid("replication is a number from 1 to 32"))?;
            }
            // Its name only: a value may be a secret.
            _ => {
                let name = kv.split('=').next().unwrap_or_default();
                return Err(invalid(format!("unknown parameter {name:?}")));
            }
        }
    }
    Ok(Target {
        hosts,
        keyspace: keyspace.to_string(),
        replication,
    })
}

/// Keyspace names are spliced into CQL, so only plain lower-case names pass
/// (Cassandra's own limit is 48 characters).
fn check_keyspace(k: &str) -> StoreResult<()> {
    let ok = !k.is_empty()
        && k.len() <= 48
        && k.starts_with(|c: char| c.is_ascii_lowercase())
        && k.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "keyspace {k:?}: use 1 to 48 lower-case letters, digits and _, starting with a letter"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse() {
        let t = parse("cassandra://127.0.0.1:9042,127.0.0.2:9043/tarn?replication=1").unwrap();
        assert_eq!(t.hosts, vec!["127.0.0.1:9042", "127.0.0.2:9043"]);
        assert_eq!(t.keyspace, "tarn");
        assert_eq!(t.replication, 1);
        let e = parse("cassandra://user:secret@db.example/ks")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("secret"), "{e}");
        let t = parse("cassandra://db.example/ks").unwrap();
        assert_eq!(t.hosts, vec!["db.example:9042"]);
        assert_eq!(t.replication, 3);
        let t = parse("cassandra://[::1]:9000,[::1]/ks").unwrap();
        assert_eq!(t.hosts, vec!["[::1]:9000", "[::1]:9042"]);
    }

    #[test]
    fn bad_urls_are_refused() {
        for bad in [
            "postgres://h/db",
            "cassandra://h",
            "cassandra://h/",
            "cassandra:///ks",
            "cassandra://h,/ks",
            "cassandra://h:port/ks",
            "cassandra://h/Bad",
            "cassandra://h/ks;drop",
            "cassandra://h/ks?replication=0",
            "cassandra://h/ks?replication=x",
            "cassandra://h/ks?replicaton=3",
        ] {
            assert!(
                matches!(parse(bad), Err(StoreError::Invalid(_))),
                "{bad} must be refused"
            );
        }
    }
}
