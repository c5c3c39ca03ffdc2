//! Errors of the cells module: config problems (with file, line, field), infeasible
//! assignments, illegal requests and broken invariants.

/// A config that cannot be used; nothing is built from it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{file}: cannot read cells config: {source}")]
    Io {
        /// Path as given.
        file: String,
        /// Underlying error.
        source: std::io::Error,
    },
    /// JSON syntax or schema error.
    #[error("{file}:{line}:{column}: field `{field}`: {message}")]
    Syntax {
        /// Path as given.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// JSON path of the offending field.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// Parsed, but inconsistent (unknown chain, bad level, wrong node count...).
    #[error("{file}:{line}: field `{field}`: {message}")]
    Invalid {
        /// Path as given.
        file: String,
        /// 1-based line of the field (0 when unknown).
        line: usize,
        /// JSON path of the offending field.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The virtual clusters ask for more cells than the physical cluster can give.
    #[error(transparent)]
    Infeasible(Box<Infeasible>),
}

/// Details of an infeasible VC assignment.
#[derive(Debug, thiserror::Error)]
#[error(
    "{file}:{line}: field `{field}`: virtual cluster `{vc}` is infeasible: chain `{chain}` level `{level}` \
     (level {level_number}) is short of {short} cell(s) once `{vc}` is added \
     (the physical cluster has {physical_gpus} GPUs in this chain; cells requested so far \
     by level: {requested})"
)]
pub struct Infeasible {
    /// Path as given.
    pub file: String,
    /// 1-based line of the VC's entry (0 when unknown).
    pub line: usize,
    /// JSON path of the VC's cells.
    pub field: String,
    /// First VC (in file order) whose cells do not fit.
    pub vc: String,
    /// Chain name.
    pub chain: String,
    /// Level name where the shortfall appears.
    pub level: String,
    /// Level number (1 = GPU).
    pub level_number: u8,
    /// Missing cells at that level.
    pub short: i64,
    /// GPUs of the chain.
    pub physical_gpus: u64,
    /// Human-readable counts per level requested by all VCs up to and including `vc`.
    pub requested: String,
}

/// Why an allocation or release was refused; the cluster state is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// The VC has no free cell at that level: the request is outside its assignment.
    #[error("virtual cluster `{vc}` has no free level-{level} cell left in chain `{chain}` (request is outside its assignment)")]
    NotInAssignment {
        /// VC name.
        vc: String,
        /// Chain name.
        chain: String,
        /// Level number.
        level: u8,
    },
    /// The request is legal but every cell it could be bound to safely has bad GPUs
    /// (the VC's cells are "doomed" to bad hardware until it is repaired).
    #[error("virtual cluster `{vc}`: every level-{level} cell of chain `{chain}` it may take now has bad GPUs")]
    OnlyBadHardware {
        /// VC name.
        vc: String,
        /// Chain name.
        chain: String,
        /// Level number.
        level: u8,
    },
    /// No physical cell satisfies an opportunistic request.
    #[error("no free level-{level} cell for opportunistic use in chain `{chain}`")]
    NoOpportunisticCell {
        /// Chain name.
        chain: String,
        /// Level number.
        level: u8,
    },
    /// A GPU named in a request cannot be used as asked.
    #[error("GPU {gpu} cannot be used: {why}")]
    GpuUnavailable {
        /// GPU address `node/index`.
        gpu: String,
        /// Reason.
        why: &'static str,
    },
    /// A GPU in use already (work pinned to it) that the VC cannot register as its own.
    #[error("GPU {gpu} cannot be registered: {why}")]
    NotRegistrable {
        /// GPU address `node/index`.
        gpu: String,
        /// Reason.
        why: String,
    },
    /// A handle or id that does not name a live object.
    #[error("unknown or stale {what}: {id}")]
    Unknown {
        /// Kind of object.
        what: &'static str,
        /// The id given.
        id: String,
    },
    /// The safety invariant would not hold (a bug if it ever shows: Theorem 1 rules it out).
    #[error("safety invariant violated: {0}")]
    Safety(String),
}
