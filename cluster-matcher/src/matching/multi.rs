//! Up to `k` offline jobs per online GPU: an exact solver for additive weights and an
//! iterated-matching greedy for weights with interactions.
