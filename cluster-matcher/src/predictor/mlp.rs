//! The per-GPU-type MLP: training with candle (SGD with momentum) and plain-Rust inference.

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::Optimizer;
use serde::{Deserialize, Serialize};

use super::features::{INPUT_WIDTH, SM_INPUT};
use super::PredictorError;

/// Training hyper-parameters (MuxFlow §6: 4 layers, hidden 64, momentum SGD).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainConfig {
    /// Width of each hidden layer.
    pub hidden: usize,
    /// Number of linear layers, input and output layers included.
    pub layers: usize,
    /// Full passes over the training data.
    pub epochs: usize,
    /// SGD step size.
    pub learning_rate: f64,
    /// SGD momentum coefficient (0 = plain SGD).
    pub momentum: f64,
    /// Seed of the [`SplitMix`] used for initial weights and shuffling.
    pub seed: u64,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            hidden: 64,
            layers: 4,
            epochs: 1500,
            learning_rate: 0.02,
            momentum: 0.9,
            seed: 7,
        }
    }
}

/// One dense layer: `w` is `out × in`, row-major.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Layer {
    /// Weights: `w[o][i]` from input `i` to output `o`.
    pub w: Vec<Vec<f32>>,
    /// Bias per output.
    pub b: Vec<f32>,
}

/// A trained network for one GPU type with its input standardization. Output is the log of
/// the normalized throughput.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuModel {
    /// Mean of each input over the training data (subtracted before the first layer).
    pub mean: Vec<f64>,
    /// Standard deviation of each input (divides after the mean is subtracted).
    pub std: Vec<f64>,
    /// Dense layers, input first; ReLU between them, none after the last.
    pub layers: Vec<Layer>,
}

/// Smallest normalized throughput the network is trained towards (log of 0 is undefined).
pub const MIN_TARGET: f64 = 1e-3;
/// Largest normalized throughput a prediction may report.
pub const MAX_PREDICTION: f64 = 1.5;

/// Deterministic generator for weight initialisation and data splits (splitmix64).
#[derive(Debug, Clone)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// Next pseudo-random 64-bit value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// SGD with classical momentum (`v = μv + g; w -= lr·v`), as in PyTorch's `SGD(momentum=μ)`;
/// candle-nn's own `SGD` has no momentum.
struct MomentumSgd {
    vars: Vec<(Var, Tensor)>,
    lr: f64,
    momentum: f64,
}

impl Optimizer for MomentumSgd {
    type Config = (f64, f64);

    fn new(vars: Vec<Var>, (lr, momentum): (f64, f64)) -> candle_core::Result<Self> {
        let vars = vars
            .into_iter()
            .map(|v| {
                let z = v.zeros_like()?;
                Ok((v, z))
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(Self { vars, lr, momentum })
    }

    fn step(&mut self, grads: &candle_core::backprop::GradStore) -> candle_core::Result<()> {
        for (var, velocity) in &mut self.vars {
            if let Some(g) = grads.get(var) {
                *velocity = ((&*velocity * self.momentum)? + g)?;
                var.set(&var.sub(&(&*velocity * self.lr)?)?)?;
            }
        }
        Ok(())
    }

    fn learning_rate(&self) -> f64 {
        self.lr
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.lr = lr;
    }
}

/// Per-feature mean and (population) variance of `rows`; the MLP and the neighbours model
/// both standardize their inputs from these.
pub(super) fn mean_and_variance(rows: &[[f64; INPUT_WIDTH]]) -> (Vec<f64>, Vec<f64>) {
    let n = rows.len().max(1) as f64;
    let mut mean = vec![0.0; INPUT_WIDTH];
    let mut var = vec![0.0; INPUT_WIDTH];
    for r in rows {
        for (m, x) in mean.iter_mut().zip(r) {
            *m += x / n;
        }
    }
    for r in rows {
        for ((s, x), m) in var.iter_mut().zip(r).zip(&mean) {
            *s += (x - m).powi(2) / n;
        }
    }
    (mean, var)
}

fn standardization(rows: &[[f64; INPUT_WIDTH]]) -> (Vec<f64>, Vec<f64>) {
    let (mean, mut std) = mean_and_variance(rows);
    for s in &mut std {
        *s = if *s > 1e-12 { s.sqrt() } else { 1.0 };
    }
    (mean, std)
}

fn candle_err(e: candle_core::Error) -> PredictorError {
    PredictorError::Training(e.to_string())
}

/// Trains one GPU type's network on `rows` (inputs) and `targets` (normalized throughputs).
///
/// An input that is constant in the data (the SM fraction in Gavel's measurements, all at an
/// uncapped 100%) gets zero first-layer weights, and its gradient stays zero: the network does
/// not invent an effect that the data cannot show.
pub fn train(
    rows: &[[f64; INPUT_WIDTH]],
    targets: &[f64],
    cfg: &TrainConfig,
) -> Result<GpuModel, PredictorError> {
    if rows.is_empty() || rows.len() != targets.len() {
        return Err(PredictorError::Training(format!(
            "need matching non-empty inputs and targets, got {} and {}",
            rows.len(),
            targets.len()
        )));
    }
    if cfg.layers < 2 || cfg.hidden == 0 {
        return Err(PredictorError::Training("need at least 2 layers and hidden > 0".into()));
    }
    let (mut mean, std) = standardization(rows);
    let constant: Vec<bool> = (0..INPUT_WIDTH)
        .map(|j| rows.iter().all(|r| (r[j] - rows[0][j]).abs() < 1e-12))
        .collect();
    for (j, c) in constant.iter().enumerate() {
        if *c {
            mean[j] = rows[0][j];
        }
    }
    let dev = Device::Cpu;
    let n = rows.len();
    let xs: Vec<f32> = rows
        .iter()
        .flat_map(|r| (0..INPUT_WIDTH).map(|j| ((r[j] - mean[j]) / std[j]) as f32))
        .collect();
    let ys: Vec<f32> = targets.iter().map(|y| y.max(MIN_TARGET).ln() as f32).collect();
    let x = Tensor::from_vec(xs, (n, INPUT_WIDTH), &dev).map_err(candle_err)?;
    let y = Tensor::from_vec(ys, (n, 1), &dev).map_err(candle_err)?;

    let mut rng = SplitMix(cfg.seed);
    let mut vars = Vec::new();
    let mut dims = vec![INPUT_WIDTH];
    dims.extend(std::iter::repeat_n(cfg.hidden, cfg.layers - 1));
    dims.push(1);
    for (l, pair) in dims.windows(2).enumerate() {
        let (fan_in, fan_out) = (pair[0], pair[1]);
        let bound = (6.0 / fan_in as f64).sqrt();
        let w: Vec<f32> = (0..fan_out * fan_in)
            .map(|k| {
                let v = (rng.unit() * 2.0 - 1.0) * bound;
                if l == 0 && constant[k % fan_in] {
                    0.0
                } else {
                    v as f32
                }
            })
            .collect();
        let w = Var::from_tensor(&Tensor::from_vec(w, (fan_out, fan_in), &dev).map_err(candle_err)?)
            .map_err(candle_err)?;
        let b = Var::zeros(fan_out, DType::F32, &dev).map_err(candle_err)?;
        vars.push((w, b));
    }
    let all: Vec<Var> = vars.iter().flat_map(|(w, b)| [w.clone(), b.clone()]).collect();
    let mut opt = MomentumSgd::new(all, (cfg.learning_rate, cfg.momentum)).map_err(candle_err)?;

    let forward = |x: &Tensor| -> candle_core::Result<Tensor> {
        let mut h = x.clone();
        for (i, (w, b)) in vars.iter().enumerate() {
            h = h.matmul(&w.as_tensor().t()?)?.broadcast_add(b.as_tensor())?;
            if i + 1 < vars.len() {
                h = h.relu()?;
            }
        }
        Ok(h)
    };
    for epoch in 0..cfg.epochs {
        let out = forward(&x).map_err(candle_err)?;
        let loss = candle_nn::loss::mse(&out, &y).map_err(candle_err)?;
        opt.backward_step(&loss).map_err(candle_err)?;
        if epoch % 500 == 0 || epoch + 1 == cfg.epochs {
            let l = loss.to_scalar::<f32>().map_err(candle_err)?;
            if !l.is_finite() {
                return Err(PredictorError::Training(format!(
                    "loss diverged at epoch {epoch}; lower the learning rate"
                )));
            }
            tracing::debug!(epoch, loss = l, "training");
        }
    }
    let layers = vars
        .iter()
        .map(|(w, b)| {
            Ok(Layer {
                w: w.as_tensor().to_vec2::<f32>()?,
                b: b.as_tensor().to_vec1::<f32>()?,
            })
        })
        .collect::<candle_core::Result<Vec<_>>>()
        .map_err(candle_err)?;
    Ok(GpuModel { mean, std, layers })
}

impl GpuModel {
    /// Predicted normalized throughput for one input row, in `[0, MAX_PREDICTION]`.
    pub fn predict(&self, row: &[f64; INPUT_WIDTH]) -> f64 {
        let mut h: Vec<f32> = row
            .iter()
            .zip(self.mean.iter().zip(&self.std))
            .map(|(x, (m, s))| ((x - m) / s) as f32)
            .collect();
        let mut next = Vec::with_capacity(64);
        for (i, layer) in self.layers.iter().enumerate() {
            next.clear();
            for (wrow, b) in layer.w.iter().zip(&layer.b) {
                let v: f32 = wrow.iter().zip(&h).map(|(w, x)| w * x).sum::<f32>() + b;
                next.push(if i + 1 < self.layers.len() { v.max(0.0) } else { v });
            }
            std::mem::swap(&mut h, &mut next);
        }
        (f64::from(h[0])).exp().clamp(0.0, MAX_PREDICTION)
    }

    /// Checks shapes and values; `what` names the model in the error.
    pub fn validate(&self, what: &str) -> Result<(), String> {
        if self.mean.len() != INPUT_WIDTH || self.std.len() != INPUT_WIDTH {
            return Err(format!("{what}: standardization has wrong width (want {INPUT_WIDTH})"));
        }
        if self.std.iter().any(|s| !(s.is_finite() && *s > 0.0)) || self.mean.iter().any(|m| !m.is_finite()) {
            return Err(format!("{what}: standardization has a non-finite or non-positive value"));
        }
        let mut width = INPUT_WIDTH;
        for (i, l) in self.layers.iter().enumerate() {
            if l.w.is_empty() || l.w.len() != l.b.len() {
                return Err(format!("{what}: layer {i} has {} rows but {} biases", l.w.len(), l.b.len()));
            }
            if let Some(r) = l.w.iter().position(|r| r.len() != width) {
                return Err(format!("{what}: layer {i} row {r} has wrong width (want {width})"));
            }
            if l.w.iter().flatten().chain(&l.b).any(|v| !v.is_finite()) {
                return Err(format!("{what}: layer {i} holds a non-finite weight"));
            }
            width = l.w.len();
        }
        if self.layers.is_empty() || width != 1 {
            return Err(format!("{what}: network must end in a single output"));
        }
        Ok(())
    }

    /// Whether the SM-fraction input can move the output at all.
    pub fn uses_sm_input(&self) -> bool {
        self.layers
            .first()
            .is_some_and(|l| l.w.iter().any(|r| r[SM_INPUT] != 0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy(n: usize) -> (Vec<[f64; INPUT_WIDTH]>, Vec<f64>) {
        let mut rng = SplitMix(3);
        let mut rows = Vec::new();
        let mut ys = Vec::new();
        for _ in 0..n {
            let mut r = [0.0; INPUT_WIDTH];
            for v in r.iter_mut().take(SM_INPUT) {
                *v = rng.unit();
            }
            r[SM_INPUT] = 1.0;
            ys.push(0.2 + 0.6 * r[0] * (1.0 - r[6]));
            rows.push(r);
        }
        (rows, ys)
    }

    #[test]
    fn momentum_sgd_fits_a_smooth_function() {
        let (rows, ys) = toy(120);
        let cfg = TrainConfig { epochs: 300, ..TrainConfig::default() };
        let m = train(&rows, &ys, &cfg).unwrap();
        m.validate("toy").unwrap();
        let mape: f64 = rows
            .iter()
            .zip(&ys)
            .map(|(r, y)| (m.predict(r) - y).abs() / y)
            .sum::<f64>()
            / ys.len() as f64;
        let mean = ys.iter().sum::<f64>() / ys.len() as f64;
        let base: f64 = ys.iter().map(|y| (mean - y).abs() / y).sum::<f64>() / ys.len() as f64;
        assert!(mape < base * 0.5, "mape {mape} vs baseline {base}");
    }

    fn log_mse(m: &GpuModel, rows: &[[f64; INPUT_WIDTH]], ys: &[f64]) -> f64 {
        rows.iter().zip(ys).map(|(r, y)| (m.predict(r).ln() - y.ln()).powi(2)).sum::<f64>() / ys.len() as f64
    }

    #[test]
    fn momentum_makes_the_same_epochs_go_further() {
        let (rows, ys) = toy(60);
        let with = TrainConfig { epochs: 80, ..TrainConfig::default() };
        let without = TrainConfig { momentum: 0.0, ..with };
        let a = log_mse(&train(&rows, &ys, &with).unwrap(), &rows, &ys);
        let b = log_mse(&train(&rows, &ys, &without).unwrap(), &rows, &ys);
        assert!(a < b * 0.7, "with momentum {a}, without {b}");
    }

    #[test]
    fn constant_sm_input_has_no_learned_effect() {
        let (rows, ys) = toy(50);
        let m = train(&rows, &ys, &TrainConfig { epochs: 20, ..TrainConfig::default() }).unwrap();
        assert!(!m.uses_sm_input());
        let mut r = rows[0];
        let a = m.predict(&r);
        r[SM_INPUT] = 0.3;
        assert_eq!(a, m.predict(&r));
    }

    #[test]
    fn validate_rejects_bad_shapes() {
        let (rows, ys) = toy(20);
        let m = train(&rows, &ys, &TrainConfig { epochs: 2, ..TrainConfig::default() }).unwrap();
        let mut bad = m.clone();
        bad.layers[1].w[3].pop();
        assert!(bad.validate("m").unwrap_err().contains("layer 1 row 3"));
        let mut bad = m.clone();
        bad.layers[0].b[0] = f32::NAN;
        assert!(bad.validate("m").unwrap_err().contains("non-finite"));
    }
}
