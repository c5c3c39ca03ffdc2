//! What the node runtime shares between processes: config schema, the per-GPU ledger layout, the health-state enum.
