//! The alert outbox's rows: the evaluator appends [`AlertEvent`]s inside its own
//! transaction; notifiers read them in `seq` order after their own position.

use std::path::Path;

use rusqlite::{params, Connection};

use super::{Ctx, StoreError};
use crate::alert::event::AlertEvent;

/// Appends `ev` to the outbox on `conn` (normally inside the caller's transaction, with the
/// state change it reports); returns its sequence number. `path` names the store in errors.
pub fn enqueue(
    conn: &Connection,
    path: &Path,
    ev: &AlertEvent,
    now_ns: i64,
) -> Result<i64, StoreError> {
    // Serializing plain strings, numbers and maps cannot fail; keep the error typed anyway.
    let body = serde_json::to_string(ev).map_err(|e| StoreError::Sqlite {
        path: path.to_path_buf(),
        source: rusqlite::Error::ToSqlConversionFailure(Box::new(e)),
    })?;
    conn.execute(
        "INSERT INTO alert_outbox (created_ns, event) VALUES (?1, ?2)",
        params![now_ns, body],
    )
    .ctx(path)?;
    Ok(conn.last_insert_rowid())
}
