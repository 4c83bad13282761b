"""The coefficients of ggrad_erf (ggrad_cpu.inc: GELU's kernel), and their check.

    .venv/bin/python scripts/ggml_kernels/erf_fit.py

erf(t) for t = |x|: below 1, t P(t^2) with P's constant term split into two floats; on
[1, 2), [2, 3) and [3, 4) a polynomial of degree 11 in t - 1.5, 2.5, 3.5; from 4 on, 1
(erf(4) rounds to 1 in float32). Each piece is fitted by least squares on Chebyshev nodes
in float64. The check evaluates the pieces as the kernel does, in float32 with fused
multiply-adds (each rounded once), over 3 million points of [0, 4.2], and prints the
largest and the mean error in ulps of float32 erf against float64 erf.
"""

from __future__ import annotations

from math import erf

import numpy as np

EDGES = (1.0, 2.0, 3.0, 4.0)
DEGREE_SMALL, DEGREE_PIECES = 8, 11
f32 = np.float32
verf = np.vectorize(erf)


def fit(lo: float, hi: float, degree: int, fn, var) -> np.ndarray:
    k = np.arange(4000)
    t = (lo + hi) / 2 + (hi - lo) / 2 * np.cos(np.pi * (k + 0.5) / len(k))
    return np.polynomial.polynomial.polyfit(var(t), fn(t), degree)


def fma(a: np.ndarray, b, c) -> np.ndarray:
    """a * b + c rounded once to float32 (a float64 product of two floats is exact)."""
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float32)).astype(np.float32)


def horner(coefficients, v: np.ndarray) -> np.ndarray:
    r = np.full(v.shape, f32(coefficients[-1]), dtype=np.float32)
    for c in coefficients[-2::-1]:
        r = fma(r, v, f32(c))
    return r


def main() -> None:
    small = fit(0.0, EDGES[0], DEGREE_SMALL, lambda t: verf(t) / t, lambda t: t * t)
    hi = f32(small[0])
    lo = f32(small[0] - np.float64(hi))
    pieces = [(a, b, fit(a, b, DEGREE_PIECES, verf, lambda t, m=(a + b) / 2: t - m))
              for a, b in zip(EDGES[:-1], EDGES[1:])]

    t = np.linspace(0, 4.2, 3_000_001).astype(np.float32)
    s = (t * t).astype(np.float32)
    r = (s * horner(small[1:], s)).astype(np.float32)
    out = fma(t, hi, fma(t, lo, (t * r).astype(np.float32)))
    for a, b, c in pieces:
        out = np.where(t >= a, horner(c, (t - f32((a + b) / 2)).astype(np.float32)), out)
    out = np.minimum(np.where(t >= EDGES[-1], f32(1), out), f32(1))
    exact = verf(t.astype(np.float64))
    ulps = np.abs(out.astype(np.float64) - exact)[1:] / np.spacing(exact.astype(np.float32))[1:]
    print(f"constant term {float(hi)!r}f + {float(lo)!r}f")
    print("P (t^2):", ", ".join(f"{float(f32(c)):.9g}f" for c in small[1:]))
    for a, b, c in pieces:
        print(f"[{a}, {b}):", ", ".join(f"{float(f32(x)):.9g}f" for x in c))
    print(f"largest error {ulps.max():.2f} ulp (at {t[1:][ulps.argmax()]}), mean {ulps.mean():.2f} ulp")


if __name__ == "__main__":
    main()
