// The fold step every reduction kernel shares (shaders/reduce.wgsl,
// shaders/direct_reduce.wgsl), after the dtype prelude (U, V, lift, lower,
// divide) and its order (shaders/order_*.wgsl: canon, ordered_min,
// ordered_max): `step` folds one unit into the running result, rounding it
// to the dtype as a ring hop does; `last` is the final step, dividing by
// DIVISOR when it is non-zero (Avg). The last step's result goes through
// `canon`, so a NaN has one pattern whatever the adapter; steps before it
// need not (a NaN stays a NaN through sum, product, min and max), which
// keeps the check out of the direct kernel's inner steps.

// 0 sum, 1 prod, 2 min, 3 max, 4 bitand, 5 bitor, 6 bitxor.
override OP: u32;
// When non-zero, the last step divides by it (Avg).
override DIVISOR: u32 = 0u;

fn combine(a: V, b: V) -> V {
    if OP == 0u {
        return a + b;
    } else if OP == 1u {
        return a * b;
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
    if OP >= 4u {
        return step(a, b);
    }
    let v = combine(lift(a), lift(b));
    if DIVISOR != 0u {
        // Round to the storage type first, then divide: the value a sum
        // followed by a separate division gives.
        return lower(canon(divide(lift(lower(v)), DIVISOR)));
    }
    return lower(canon(v));
}
