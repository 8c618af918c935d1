// The fold step every reduction kernel shares (shaders/reduce.wgsl,
// shaders/direct_reduce.wgsl), after the dtype prelude (U, V, lift, lower,
// divide) and its order (shaders/order_*.wgsl: canon, ordered_min,
// ordered_max): `step` folds one unit into the running result, rounding it
// to the dtype as a ring hop does; `last` is the final step, dividing by
// DIVISOR when it is non-zero (Avg). Every result goes through `canon`,
// so a NaN has one pattern whatever the adapter.

// 0 sum, 1 prod, 2 min, 3 max, 4 bitand, 5 bitor, 6 bitxor.
override OP: u32;
// When non-zero, the last step divides by it (Avg).
override DIVISOR: u32 = 0u;

fn combine(a: V, b: V) -> V {
    if OP == 0u {
        return canon(a + b);
    } else if OP == 1u {
        return canon(a * b);
    } else if OP == 2u {
        return ordered_min(a, b);
    }
    return ordered_max(a, b);
}

fn step(a: U, b: U) -> U {
    // Bitwise operators act on the raw words: identical for i32 and u32.
    if OP == 4u {
        return a & b;
    } else if OP == 5u {
        return a | b;
    } else if OP == 6u {
        return a ^ b;
    }
    return lower(combine(lift(a), lift(b)));
}

fn last(a: U, b: U) -> U {
    let v = step(a, b);
    if DIVISOR != 0u && OP < 4u {
        // Round to the storage type first, then divide: the value a sum
        // followed by a separate division gives.
        return lower(canon(divide(lift(v), DIVISOR)));
    }
    return v;
}
