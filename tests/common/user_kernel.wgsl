// A user's own kernel on a rank's queue, for tests of what interleaves
// with collectives: out[i] = 2 * x[i] + K, with K an override constant.

override K: f32 = 0.0;

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    if (id.x < arrayLength(&out)) {
        out[id.x] = 2.0 * x[id.x] + K;
    }
}
