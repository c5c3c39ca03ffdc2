//! HiveD-style buddy cells: hierarchy, virtual clusters, binding, preemption, safety check.
