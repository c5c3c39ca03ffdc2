//! One placement round: health-filtered GPUs, predicted weights, matching, the emitted plan.
