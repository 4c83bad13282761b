// ggrad's IEEE float32 division and square root for Vulkan shaders (scripts/patch_ggml_kernels.py
// says why): included by DIV, SQRT, and the exact AdamW shaders.
#ifndef GGRAD_IEEE_GLSL
#define GGRAD_IEEE_GLSL

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
    // the nearest of q and its neighbours: |a - b c| is |b| times c's distance to a / b (the
    // corrections can round back onto q at a tie where the reciprocal is off)
    const uint bits = floatBitsToUint(q);
    precise float below = uintBitsToFloat(bits - 1u), above = uintBitsToFloat(bits + 1u);
    precise float off = abs(fma(-b, q, a)), off_below = abs(fma(-b, below, a)), off_above = abs(fma(-b, above, a));
    return off_below < off ? below : off_above < off ? above : q;
}

// ggrad: kernels: correctly rounded square root
float ggrad_sqrt(const float x) {
    precise float s = sqrt(x);
    if (floatBitsToUint(x) - 0x0d800000u > 0x71000000u) {
        return s;  // x outside [2^-100, 2^126]: negative, NaN, inf, zero, the extremes
    }
    precise float h = 0.5f / s;
    precise float r = fma(-s, s, x);
    s = fma(r, h, s);
    r = fma(-s, s, x);
    s = fma(r, h, s);
    // the neighbour with the smaller exact residual x - c c where one has (a root one ulp
    // high can be rounded back onto itself at a tie; every x in [1, 4) checked)
    const uint bits = floatBitsToUint(s);
    precise float below = uintBitsToFloat(bits - 1u), above = uintBitsToFloat(bits + 1u);
    precise float off = abs(fma(-s, s, x)), off_below = abs(fma(-below, below, x)), off_above = abs(fma(-above, above, x));
    return off_below < off ? below : off_above < off ? above : s;
}

#endif
