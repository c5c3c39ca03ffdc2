//! Kubernetes scheduler-extender HTTP endpoints (filter, prioritize, bind).
