// Compute ops of the graph executor, on f32 tensors. Every kernel sums in a
// fixed order, so the same inputs give the same bits on every rank and in
// every schedule.

struct Dims {
    m: u32,      // rows of the output (matmul, sum_rows: rows of the input)
    n: u32,      // columns of the output
    k: u32,      // inner dimension (matmul)
    flags: u32,  // matmul: bit 0 transposes a, bit 1 transposes b; element-wise: the op
    factor: f32, // scale
    len: u32,    // element-wise length
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> d: Dims;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// out[m x n] = A[m x k] * B[k x n], with A stored k x m when transposed
// and B stored n x k when transposed.
@compute @workgroup_size(8, 8)
fn matmul(@builtin(global_invocation_id) g: vec3<u32>) {
    let row = g.y;
    let col = g.x;
    if row >= d.m || col >= d.n {
        return;
    }
    let ta = (d.flags & 1u) != 0u;
    let tb = (d.flags & 2u) != 0u;
    var acc = 0.0;
    for (var i = 0u; i < d.k; i++) {
        let av = select(a[row * d.k + i], a[i * d.m + row], ta);
        let bv = select(b[i * d.n + col], b[col * d.k + i], tb);
        acc = acc + av * bv;
    }
    out[row * d.n + col] = acc;
}

// 0 add, 1 sub, 2 mul, 3 scale (a * factor), 4 relu, 5 relu_grad (a where b > 0).
@compute @workgroup_size(256)
fn elementwise(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = g.x + g.y * groups.x * 256u;
    if i >= d.len {
        return;
    }
    let x = a[i];
    switch d.flags {
        case 0u: { out[i] = x + b[i]; }
        case 1u: { out[i] = x - b[i]; }
        case 2u: { out[i] = x * b[i]; }
        case 3u: { out[i] = x * d.factor; }
        case 4u: { out[i] = max(x, 0.0); }
        default: { out[i] = select(0.0, x, b[i] > 0.0); }
    }
}

// out[col] = sum over the m rows of a[row * n + col], rows in order.
@compute @workgroup_size(64)
fn sum_rows(@builtin(global_invocation_id) g: vec3<u32>) {
    let col = g.x;
    if col >= d.n {
        return;
    }
    var acc = 0.0;
    for (var row = 0u; row < d.m; row++) {
        acc = acc + a[row * d.n + col];
    }
    out[col] = acc;
}
