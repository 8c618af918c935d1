// One window of n ranks' buffers reduced in a single pass, the result
// written to m of them: the shared-device reduction (NCCL's P2P read,
// PyTorch SymmetricMemory's one-shot all-reduce). Ranks that share a device
// can bind each other's buffers, so no byte crosses the host and every
// input is read once.
//
// direct.rs prepends the dtype prelude (shaders/dtype_*.wgsl: U, V, lift,
// lower, divide), the fold step (shaders/fold.wgsl: step, last) and, for
// n inputs and m outputs, the generated part:
//   bindings a0..a{n-1} (the inputs, in fold order) and o0..o{m-1};
//   fn run(gid, groups, wid) the unit this invocation folds, and its fold:
//       a0, step(_, a1), ..., last(_, a{n-1}); or, rotating, part c (row
//       c of workgroups) from input c+1 round to input c
//   fn store(i: u32, v: U) { o0[i] = v; ...; o{m-1}[i] = v; }
// Every binding is read_write: an in-place output is the very buffer of an
// input, and wgpu refuses a buffer bound read-only and writable in one pass.
// Each invocation reads and writes only its own unit, so the aliasing is
// harmless.
//
// The fold is the ring's: the partial result is rounded to the dtype after
// every step, so the bits are those a ring hop gives (see DESIGN.md,
// "Placement and transports").
//
// One unit per invocation, no grid-stride loop: on lavapipe this shape ran
// 5-10x faster than a loop over few workgroups.

// `run` (generated) finds this invocation's unit: in a dispatch of rows
// of workgroups, or, rotating, in row y = part y (a part longer than
// the adapter allows in one dimension goes on in z).
@compute @workgroup_size(64)
fn main(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    run(gid, groups, wid);
}
