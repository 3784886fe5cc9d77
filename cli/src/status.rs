//! `leaderelection status` and `leaderelection schema`.

use leaderelection::{MySqlStore, PostgresStore, DEFAULT_OPERATION_TIMEOUT};

use crate::args::{AfterRestoreArgs, Fail, Human, SchemaArgs, StatusArgs};
use crate::db::{self, Dialect};

/// Prints who leads; 0 when someone does, 1 when nobody does.
pub fn status(args: StatusArgs) -> Result<i32, Fail> {
    let store = db::open(&args.db)?;
    let lease = db::inspect(&*store, &args.db, &args.name, DEFAULT_OPERATION_TIMEOUT)?;
    // A row with no holder is held for nobody after a database failover,
    // until it runs out: nobody leads under it.
    let live = lease.as_ref().filter(|l| !l.expired() && !l.holder.is_empty());
    if args.json {
        let payload = match live.map(|l| std::str::from_utf8(&l.payload)) {
            None => "\"payload\":null".to_string(),
            Some(Ok(text)) => format!("\"payload\":{}", json_string(text)),
            Some(Err(_)) => format!("\"payload_hex\":\"{}\"", hex(&live.unwrap().payload)),
        };
        println!(
            "{{\"name\":{},\"leader\":{},\"fence\":{},\"time_left_ms\":{},{payload},\"last_leader\":{}}}",
            json_string(&args.name),
            live.map_or("null".into(), |l| json_string(&l.holder)),
            lease.as_ref().map_or("null".into(), |l| l.fence.to_string()),
            live.map_or(0, |l| l.ttl().as_millis()),
            lease.as_ref().map_or("null".into(), |l| json_string(&l.holder)),
        );
    } else {
        match (live, &lease) {
            (Some(l), _) => {
                println!("leader: {}\nfence: {}\ntime left: {}", l.holder, l.fence, Human(l.ttl()));
                // No line for no payload.
                match std::str::from_utf8(&l.payload) {
                    _ if l.payload.is_empty() => {}
                    Ok(text) => println!("payload: {}", text.replace(|c: char| c.is_control(), "?")),
                    Err(_) => println!("payload (hex): {}", hex(&l.payload)),
                }
            }
            (None, Some(l)) if l.holder.is_empty() && !l.expired() => println!(
                "nobody leads (held for nobody after a database failover, fence {}, for {} more)",
                l.fence,
                Human(l.ttl())
            ),
            (None, Some(l)) => println!(
                "nobody leads (last: {}, fence {}, expired {} ago)",
                l.holder,
                l.fence,
                Human(l.now.saturating_duration_since(l.expires_at))
            ),
            (None, None) => println!("nobody leads (no term yet)"),
        }
    }
    Ok(if live.is_some() { 0 } else { 1 })
}

/// Prints the DDL of the election table, or with `--apply` creates it.
pub fn schema(args: SchemaArgs) -> Result<i32, Fail> {
    if args.apply {
        let line = db::apply_schema(&args.db)?;
        if !args.quiet {
            println!("{line}");
        }
        return Ok(0);
    }
    let dialect = match &args.dialect {
        Some(d) => Dialect::parse(d)?,
        None => match db::dsn(&args.db) {
            Some(dsn) => Dialect::of_dsn(&dsn)?,
            None => Dialect::Postgres,
        },
    };
    let ddl = match dialect {
        Dialect::Postgres => {
            let (schema, table) = db::pg_table(args.db.table.as_deref());
            PostgresStore::schema(schema, table)
        }
        Dialect::Mysql => MySqlStore::schema(args.db.table.as_deref().unwrap_or(leaderelection::mysql::DEFAULT_TABLE)),
    };
    let ddl = ddl.map_err(|e| Fail::usage(format!("--table: {e}")))?;
    println!("{}", ddl.trim_end());
    Ok(0)
}

/// Marks every row of the election table inherited (see
/// `after-restore --help`).
pub fn after_restore(args: AfterRestoreArgs) -> Result<i32, Fail> {
    let store = db::open_as(&args.db)?;
    let marked = store.after_restore().map_err(|e| db::store_fail(&e, &args.db))?;
    if !args.quiet {
        println!(
            "marked {marked} election row{} as inherited: expired ones are held for nobody for a lease before a claim",
            if marked == 1 { "" } else { "s" }
        );
    }
    Ok(0)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `s` as a JSON string literal (RFC 8259 escaping).
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn json_escaping() {
        assert_eq!(super::json_string("a\"b\\c\nd\u{1}é"), r#""a\"b\\c\nd\u0001é""#);
    }
}
