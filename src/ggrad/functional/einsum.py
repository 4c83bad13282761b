"""einsum: Einstein summation as the batched products and sums it names."""

from __future__ import annotations

import numpy as np

from ._core import Tensor, _as_tensor, reshape
from .layout import matmul_nt, permute
from .reduce import sum


def einsum(equation: str, *operands) -> Tensor:
    """Einstein summation for two or three operands (and one, for sums and transposes),
    as products of the contractions transformers use: each pair is permuted into a batched
    matmul (ggml's MUL_MAT), and summed indices not shared are reduced first."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    operands = [_as_tensor(t) for t in operands]
    equation = equation.replace(" ", "")
    if "..." in equation:
        raise NotImplementedError("einsum with '...' is not supported; name every axis")
    inputs, arrow, output = equation.partition("->")
    terms = inputs.split(",")
    if len(terms) != len(operands):
        raise ValueError(f"einsum {equation!r} names {len(terms)} operands, got {len(operands)}")
    if not arrow:
        counts = {c: inputs.count(c) for c in set(inputs) if c != ","}
        output = "".join(sorted(c for c, k in counts.items() if k == 1))
    for term, t in zip(terms, operands):
        if len(term) != t.ndim or len(set(term)) != len(term):
            raise ValueError(f"einsum: term {term!r} does not fit an operand of shape {t.shape} "
                             "(repeated letters in one term are not supported)")
    sizes: dict[str, int] = {}
    for term, t in zip(terms, operands):
        for c, n in zip(term, t.shape):
            if sizes.setdefault(c, n) != n:
                raise ValueError(f"einsum: axis {c!r} has sizes {sizes[c]} and {n}")
    pairs = list(zip(terms, operands))
    while len(pairs) > 1:
        (ta, a), (tb, b) = pairs[0], pairs[1]
        later = output + "".join(t for t, _ in pairs[2:])
        pairs[:2] = [_contract(ta, a, tb, b, later)]
    term, out = pairs[0]
    keep = [c for c in term if c in output]
    if len(keep) < len(term):
        out = sum(out, tuple(i for i, c in enumerate(term) if c not in output))
        term = "".join(keep)
    if set(term) != set(output):
        raise ValueError(f"einsum: output {output!r} names axes the inputs do not have")
    return permute(out, tuple(term.index(c) for c in output)) if term != output else out


def _contract(ta: str, a: Tensor, tb: str, b: Tensor, later: str) -> tuple[str, Tensor]:
    """One pairwise contraction: batch axes (in both and kept), the contracted axes (in
    both, not kept) and each side's own axes, as one batched a @ b^T."""
    def drop_own(term: str, t: Tensor, other: str) -> tuple[str, Tensor]:
        own = tuple(i for i, c in enumerate(term) if c not in other and c not in later)
        if not own:  # summed on one side only: reduced away first
            return term, t
        return "".join(c for i, c in enumerate(term) if i not in own), sum(t, own)
    ta, a = drop_own(ta, a, tb)
    tb, b = drop_own(tb, b, ta)
    batch = [c for c in ta if c in tb and c in later]
    contracted = [c for c in ta if c in tb and c not in later]
    left = [c for c in ta if c not in tb]
    right = [c for c in tb if c not in ta]
    if len(batch) > 2:
        raise ValueError("einsum: at most 2 batch axes per contraction (ggml tensors have 4 dimensions)")
    size = {c: n for term, t in ((ta, a), (tb, b)) for c, n in zip(term, t.shape)}

    def grouped(term: str, t: Tensor, groups: list[list[str]]) -> Tensor:
        order = [c for g in groups for c in g]
        t = permute(t, tuple(term.index(c) for c in order)) if order != list(term) else t
        return reshape(t, tuple(size[c] for c in batch) + tuple(
            int(np.prod([size[c] for c in g], dtype=np.int64)) for g in groups[1:]))

    a2 = grouped(ta, a, [batch, left, contracted])
    b2 = grouped(tb, b, [batch, right, contracted])
    product = matmul_nt(a2, b2)  # batch + (left, right)
    term = "".join(batch + left + right)
    return term, reshape(product, tuple(size[c] for c in term)) if term else reshape(product, ())
