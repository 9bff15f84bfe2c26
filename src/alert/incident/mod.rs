//! Incidents: the spike-triage snapshot stored when an alert instance fires (placeholder:
//! owned by the triage work, which replaces this file).

use std::path::Path;

use super::event::Firing;

/// Why an incident could not be stored.
#[derive(Debug, thiserror::Error)]
pub enum IncidentError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// Takes the triage snapshot for `firing` and stores the incident in the store under
/// `data_dir`; returns its id. Blocking: call it from the blocking pool. `now_ns` is the
/// evaluation time.
pub fn open(data_dir: &Path, firing: &Firing, now_ns: i64) -> Result<Option<i64>, IncidentError> {
    let _ = (data_dir, firing, now_ns);
    Ok(None)
}
