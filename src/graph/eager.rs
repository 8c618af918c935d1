//! Eager execution with async tensors, as PyTorch's AsyncCollectiveTensor:
//! the value a collective returns can be passed straight to compute ops or
//! read with `to_vec`; the first read waits on the collective, and asking
//! for its length or dtype does not.

use std::sync::{Mutex, OnceLock};

use crate::graph::compute::{self, Elementwise};
use crate::{DType, Element, Tensor, Work};
use crate::{Error, Result};

/// A collective's result that waits for itself on first read.
pub struct AsyncTensor {
    work: Mutex<Option<Work>>,
    ready: OnceLock<Result<Tensor>>,
    len: usize,
    dtype: DType,
}

impl std::fmt::Debug for AsyncTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "AsyncTensor({} x {}, ready: {})",
            self.len,
            self.dtype,
            self.ready.get().is_some()
        )
    }
}

impl AsyncTensor {
    /// Wraps a collective in flight (its first output).
    pub fn new(work: Work) -> AsyncTensor {
        let (len, dtype) = (work.len(), work.dtype());
        AsyncTensor {
            work: Mutex::new(Some(work)),
            ready: OnceLock::new(),
            len,
            dtype,
        }
    }

    /// Number of elements (does not wait).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no elements (does not wait).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Element type (does not wait).
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Whether the value has been waited for already.
    pub fn is_ready(&self) -> bool {
        self.ready.get().is_some()
    }

    /// The value, waiting for the collective the first time.
    pub fn wait(&self) -> Result<Tensor> {
        self.ready
            .get_or_init(|| match self.work.lock().ok().and_then(|mut w| w.take()) {
                Some(w) => w.wait(),
                None => Err(Error::InvalidArgument {
                    rank: None,
                    what: "the collective's work was already taken".into(),
                }),
            })
            .clone()
    }

    /// Copies the value to the host (waiting first).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.wait()?.to_vec()
    }
}

/// Anything a compute op reads: a tensor, or an async tensor (waited for).
pub trait Operand {
    /// The tensor, ready to read.
    fn ready(&self) -> Result<Tensor>;
}

impl Operand for Tensor {
    fn ready(&self) -> Result<Tensor> {
        Ok(self.clone())
    }
}

impl Operand for AsyncTensor {
    fn ready(&self) -> Result<Tensor> {
        self.wait()
    }
}

/// `a @ b` on `a`'s device: `a` is `[m, k]` (`[k, m]` with `transpose_a`),
/// `b` is `[k, n]` (`[n, k]` with `transpose_b`); f32.
pub fn matmul(
    a: &impl Operand,
    b: &impl Operand,
    [m, k, n]: [usize; 3],
    transpose_a: bool,
    transpose_b: bool,
) -> Result<Tensor> {
    let (a, b) = (a.ready()?, b.ready()?);
    compute::matmul(&a, &b, m, k, n, transpose_a, transpose_b)
}

fn elementwise(
    op: Elementwise,
    a: &impl Operand,
    b: Option<&dyn Fn() -> Result<Tensor>>,
    factor: f32,
) -> Result<Tensor> {
    let a = a.ready()?;
    let b = match b {
        Some(b) => b()?,
        None => a.clone(),
    };
    compute::elementwise(op, &a, &b, factor)
}

/// `a + b`.
pub fn add(a: &impl Operand, b: &impl Operand) -> Result<Tensor> {
    elementwise(Elementwise::Add, a, Some(&|| b.ready()), 0.0)
}

/// `a - b`.
pub fn sub(a: &impl Operand, b: &impl Operand) -> Result<Tensor> {
    elementwise(Elementwise::Sub, a, Some(&|| b.ready()), 0.0)
}

/// `a * b`.
pub fn mul(a: &impl Operand, b: &impl Operand) -> Result<Tensor> {
    elementwise(Elementwise::Mul, a, Some(&|| b.ready()), 0.0)
}

/// `a * factor`.
pub fn scale(a: &impl Operand, factor: f32) -> Result<Tensor> {
    elementwise(Elementwise::Scale, a, None, factor)
}

/// `max(a, 0)`.
pub fn relu(a: &impl Operand) -> Result<Tensor> {
    elementwise(Elementwise::Relu, a, None, 0.0)
}

/// `grad` where `x > 0`, else 0.
pub fn relu_grad(grad: &impl Operand, x: &impl Operand) -> Result<Tensor> {
    elementwise(Elementwise::ReluGrad, grad, Some(&|| x.ready()), 0.0)
}

/// Sum over the `m` rows of `a` (`[m, n]`).
pub fn sum_rows(a: &impl Operand, m: usize, n: usize) -> Result<Tensor> {
    let a = a.ready()?;
    compute::sum_rows(&a, m, n)
}
