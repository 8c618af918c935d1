// Writes the low half-word of src[0] over the low half-word of one dst
// word, keeping its high half: the last element of a 16-bit view of odd
// length, whose neighbouring half-word belongs to someone else.
//
// Dispatched as (index + 1) workgroups of one invocation: the last one
// writes dst[index] (so the index needs no uniform buffer).

@group(0) @binding(0) var<storage, read_write> dst: array<u32>;
@group(0) @binding(1) var<storage, read> src: array<u32>;

@compute @workgroup_size(1)
fn main(@builtin(workgroup_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
    if (id.x + 1u == n.x) {
        dst[id.x] = (dst[id.x] & 0xffff0000u) | (src[0] & 0xffffu);
    }
}
