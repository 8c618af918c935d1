// Element-wise reduction of one slice: dst[i] = last(dst[i], src[i]), the
// fold step of shaders/fold.wgsl (prepended by kernels.rs, after the dtype
// prelude).
//
// A dtype prelude (shaders/dtype_*.wgsl, prepended by kernels.rs) defines
// the storage unit U (the words one invocation handles: vec4<u32>, or
// vec2<u32> for the 16-bit types, whose four halves widen to vec4<f32>),
// the value type V, lift (U -> V), lower (V -> U) and divide (V / n).
// Every dtype is thus carried in plain u32 words and runs on every adapter.
// Handling a vector per invocation matters: on CPU adapters the cost is
// per invocation, and a scalar kernel runs several times slower.
//
// Both buffers are bound as windows of exactly the slice, so the slice
// length is arrayLength(&dst) and no parameter buffer is needed.

@group(0) @binding(0) var<storage, read_write> dst: array<U>;
@group(0) @binding(1) var<storage, read> src: array<U>;

// A grid-stride loop: any number of workgroups covers the slice. GPUs get
// one unit per invocation (occupancy hides memory latency); CPU adapters
// get few workgroups of many units each, since there the cost is per
// workgroup scheduled (see `reduction_workgroups` in kernels.rs).
@compute @workgroup_size(256)
fn main(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let stride = groups.x * 256u;
    let n = arrayLength(&dst);
    for (var i = gid.x; i < n; i += stride) {
        dst[i] = last(dst[i], src[i]);
    }
}
