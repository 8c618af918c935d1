// Element-wise reduction of one slice: dst[i] = finish(op(dst[i], src[i])).
//
// Works on 32-bit words so that every dtype runs on every adapter: a dtype
// prelude (shaders/dtype_*.wgsl, prepended by kernels.rs) defines the value
// type V, lift (word -> V), lower (V -> word) and divide (V / n). 16-bit
// types hold two elements per word and V is vec2<f32>.
//
// Both buffers are bound as windows of exactly the slice, so the slice length
// is arrayLength(&dst) and no parameter buffer is needed.

// 0 sum, 1 prod, 2 min, 3 max, 4 bitand, 5 bitor, 6 bitxor.
override OP: u32;
// When non-zero, the result is divided by it (the last step of Avg).
override DIVISOR: u32 = 0u;

@group(0) @binding(0) var<storage, read_write> dst: array<u32>;
@group(0) @binding(1) var<storage, read> src: array<u32>;

fn combine(a: V, b: V) -> V {
    if OP == 0u {
        return a + b;
    } else if OP == 1u {
        return a * b;
    } else if OP == 2u {
        return min(a, b);
    }
    return max(a, b);
}

fn reduce_word(a: u32, b: u32) -> u32 {
    // Bitwise operators act on the raw word: identical for i32 and u32.
    if OP == 4u {
        return a & b;
    } else if OP == 5u {
        return a | b;
    } else if OP == 6u {
        return a ^ b;
    }
    let v = lower(combine(lift(a), lift(b)));
    if DIVISOR != 0u {
        // Round to the storage type first, then divide: the same value a
        // sum followed by a separate division would give.
        return lower(divide(lift(v), DIVISOR));
    }
    return v;
}

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let n = arrayLength(&dst);
    let stride = groups.x * 256u;
    for (var i = gid.x; i < n; i += stride) {
        dst[i] = reduce_word(dst[i], src[i]);
    }
}
