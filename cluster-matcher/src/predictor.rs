//! Speed predictor: normalized throughput of an offline job next to an online one, per GPU type.
