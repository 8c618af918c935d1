// The kernel of examples/own_buffers.rs: a user's own computation that
// writes a gradient, here grad[i] = (rank + 1) * i, with rank an override
// constant.

override RANK: f32 = 0.0;

@group(0) @binding(0) var<storage, read_write> grad: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&grad)) {
        grad[id.x] = (RANK + 1.0) * f32(id.x);
    }
}
