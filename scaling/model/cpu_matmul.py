"""A matrix product whose weight gradient XLA:CPU computes at full speed.

The backward pass of ``y = x @ w`` with ``x`` [tokens, in] needs
``dw = xᵀ @ dy``: a product that contracts the first axis of both operands.
XLA:CPU folds the transpose into its matmul kernel's operand, and on the
2-core AVX-512 machine this project is measured on that kernel was up to
1.5× slower than the same product with ``xᵀ`` written out first (8.4 against
5.7 ms for [2048, 256]ᵀ @ [2048, 1024]; the whole step 6–7% faster:
``benchmarks/README.md``, "The weight gradient's transposed operand"). The
copy costs one pass over ``x``, a few percent of the product.

``dot_general_for(platform)`` hands Flax's ``Dense`` layers (their
``dot_general`` attribute) a product whose custom backward pass writes ``xᵀ``
behind an optimization barrier, so XLA cannot fold it back, in one-device CPU
programs only: on TPUs and GPUs the compiler picks layouts for its own matrix
units, and the plain product is left alone there. A custom VJP has no
forward-mode derivative: code that needs ``jax.jvp`` traces the model inside
``plain_products()``. The forward pass and ``dx = dy @ wᵀ`` are
the plain products; only the summation order of ``dw`` may differ in the last
bits.
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable

import jax
import jax.numpy as jnp

from scaling.model.mesh import active_mesh


@jax.custom_vjp
def _matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """[m, k] @ [k, n] → [m, n]."""
    return jnp.dot(x, w)


def _matmul_forward(x, w):
    return jnp.dot(x, w), (x, w)


def _matmul_backward(saved, grad):
    x, w = saved
    x_transposed = jax.lax.optimization_barrier(x.T)  # a real [k, m] copy, see the module docstring
    return jnp.dot(grad, w.T).astype(x.dtype), jnp.dot(x_transposed, grad).astype(w.dtype)


_matmul.defvjp(_matmul_forward, _matmul_backward)


def weight_grad_friendly_dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    """``jax.lax.dot_general`` for Flax ``Dense``/``DenseGeneral``, as a 2-D product with a fast weight gradient.

    Handles the layers' form (the input's trailing axes contracted with the
    kernel's leading ones, no batch axes, default precision, no preferred
    element type) by
    flattening both to 2-D; anything else goes to ``jax.lax.dot_general``
    unchanged.
    """
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
    count = len(lhs_contract)
    plain = (lhs_batch or rhs_batch or precision is not None or preferred_element_type is not None
             or lhs.dtype != rhs.dtype
             or tuple(lhs_contract) != tuple(range(lhs.ndim - count, lhs.ndim))
             or tuple(rhs_contract) != tuple(range(count)))
    if plain:
        return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                                   preferred_element_type=preferred_element_type)
    free_lhs, free_rhs = lhs.shape[:lhs.ndim - count], rhs.shape[count:]
    inner = math.prod(rhs.shape[:count])
    out = _matmul(lhs.reshape(math.prod(free_lhs), inner), rhs.reshape(inner, math.prod(free_rhs)))
    return out.reshape(free_lhs + free_rhs)


# Read while tracing; ``benchmarks/step_changes.py --part weight-grad`` turns it
# off to build the plain step beside this one.
TRANSPOSED_WEIGHT_GRAD_ON_CPU = True


def dot_general_for(platform: str) -> Callable | None:
    """The ``dot_general`` a Flax layer should use when compiled for ``platform`` (None: Flax's default).

    Only a one-device CPU program gets the CPU product: meshes of several CPU
    devices stand in for TPU slices (tests, the preflight's rehearsals), so
    they keep the program, and the collectives, that a TPU gets.
    """
    if platform != "cpu" or not TRANSPOSED_WEIGHT_GRAD_ON_CPU:
        return None
    mesh = active_mesh()
    return weight_grad_friendly_dot_general if mesh is None or mesh.devices.size == 1 else None


@contextlib.contextmanager
def plain_products():
    """Trace with XLA's own product inside this block: for forward-mode autodiff (``jax.jvp``, ``jax.linearize``),
    which a custom VJP does not support. The values are the same; only the backward pass's speed differs."""
    global TRANSPOSED_WEIGHT_GRAD_ON_CPU
    setting, TRANSPOSED_WEIGHT_GRAD_ON_CPU = TRANSPOSED_WEIGHT_GRAD_ON_CPU, False
    try:
        yield
    finally:
        TRANSPOSED_WEIGHT_GRAD_ON_CPU = setting
