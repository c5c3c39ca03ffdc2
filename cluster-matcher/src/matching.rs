//! Maximum-weight bipartite matching (shortest augmenting path / Jonker-Volgenant family).
