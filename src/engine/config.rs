//! `[inference]` of the config file: what the inference signals need to know about each
//! model. Plain data; it imports nothing from the rest of the crate.

use std::collections::BTreeMap;

/// `[inference]`
#[derive(Debug, Clone, Default, serde::Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct InferenceConfig {
    /// Model name -> its best batch size, for batch efficiency.
    pub optimal_batch: BTreeMap<String, f64>,
}
