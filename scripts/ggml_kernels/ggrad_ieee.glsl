// IEEE float32 semantics for Vulkan shaders whose driver may assume otherwise
// (scripts/patch_ggml_kernels.py says why): a float's sign and class read from its bits, and
// correctly rounded division and square root. Included by RELU, SILU_BACK (relu's and
// leaky_relu's gradients), DIV, SQRT, the exact AdamW shaders and the recurrent cell.
#ifndef GGRAD_IEEE_GLSL
#define GGRAD_IEEE_GLSL

// below zero: -0 and NaN are not
bool ggrad_negative(const float x) {
    const uint b = floatBitsToUint(x);
    return b > 0x80000000u && b <= 0xff800000u;
}

// +0, -0 or below zero (NaN is not: relu's gradient passes g where its output is NaN)
bool ggrad_at_most_zero(const float x) {
    return (floatBitsToUint(x) & 0x7fffffffu) == 0u || ggrad_negative(x);
}

// above zero, +inf included (NaN is not)
bool ggrad_positive(const float x) {
    return floatBitsToUint(x) - 1u < 0x7f800000u;
}

// Of c and its two neighbours, the one with the smallest exact residual |v - u c|: u the
// divisor (a quotient's), or with `root` the candidate itself (a square root's, v - c c).
float ggrad_nearest(const float c, const float u, const float v, const bool root) {
    const uint bits = floatBitsToUint(c);
    precise float below = uintBitsToFloat(bits - 1u), above = uintBitsToFloat(bits + 1u);
    precise float off = abs(fma(-(root ? c : u), c, v));
    precise float off_below = abs(fma(-(root ? below : u), below, v));
    precise float off_above = abs(fma(-(root ? above : u), above, v));
    return off_below < off ? below : off_above < off ? above : c;
}

// ggrad: kernels: correctly rounded division
float ggrad_divide(const float a, const float b) {
    precise float q = a / b;
    const uint ab = floatBitsToUint(a) & 0x7fffffffu, bb = floatBitsToUint(b) & 0x7fffffffu;
    const uint qb = floatBitsToUint(q) & 0x7fffffffu;
    if (ab - 0x17800000u > 0x67000000u || bb - 0x01000000u > 0x7d000000u || qb - 0x0d800000u > 0x70800000u) {
        return q;  // |a| outside [2^-80, 2^126], |b| outside [2^-125, 2^125], |q| outside [2^-100, 2^125]
    }
    precise float y = 1.0f / b;
    precise float e = fma(-b, y, 1.0f);
    y = fma(y, e, y);
    precise float r = fma(-b, q, a);
    q = fma(r, y, q);
    r = fma(-b, q, a);
    q = fma(r, y, q);
    // |a - b c| is |b| times c's distance to a / b (the corrections can round back onto q at
    // a tie where the reciprocal is off)
    return ggrad_nearest(q, b, a, false);
}

// sqrt(x) for x of any class but a subnormal
float ggrad_sqrt_normal(const float x) {
    precise float s = sqrt(x);
    if (floatBitsToUint(x) - 0x0d800000u > 0x71000000u) {
        return s;  // x outside [2^-100, 2^126]: negative, NaN, inf, zero, the extremes
    }
    precise float h = 0.5f / s;
    precise float r = fma(-s, s, x);
    s = fma(r, h, s);
    r = fma(-s, s, x);
    s = fma(r, h, s);
    // a root one ulp high can be rounded back onto itself at a tie (every x in [1, 4) checked)
    return ggrad_nearest(s, 0.0f, x, true);
}

// ggrad: kernels: correctly rounded square root
float ggrad_sqrt(const float x) {
    // a subnormal, which a driver may flush to zero (NVIDIA's did): a positive one is 2m 2^-150
    // for its mantissa m, so sqrt(x) = sqrt(2m) 2^-75, scaled exactly by a power of two; a
    // negative one's root is NaN
    const uint xb = floatBitsToUint(x);
    if (xb - 1u < 0x007fffffu) {
        return ggrad_sqrt_normal(float(2u * xb)) * uintBitsToFloat(0x1a000000u);
    }
    if (xb - 0x80000001u < 0x007fffffu) {
        return uintBitsToFloat(0x7fc00000u);
    }
    return ggrad_sqrt_normal(x);
}

#endif
