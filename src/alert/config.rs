//! `[alerts]` and `[[alert]]`: the evaluation period and the rules (placeholder: owned by
//! the rules work, which replaces this file).

use serde::{Deserialize, Serialize};

/// `[alerts]`
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AlertsConfig {}

/// One `[[alert]]` table.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AlertRuleConfig {}
