//! `[[notify]]` (placeholder: owned by the delivery work, which replaces this file).

use serde::{Deserialize, Serialize};

/// One `[[notify]]` table.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct NotifyConfig {}
