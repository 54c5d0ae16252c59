"""Area release: CUDA linear algebra through each library the build links, cuSOLVER and MAGMA.

The batched SVD of upstream's smoke test (``test_linalg('cuda')``) with each library preferred, and a table of
the ops torch has routed through MAGMA when it is preferred (``torch.backends.cuda.preferred_linalg_library``),
each against its defining identity in float64.

Since torch 2.11 upstream retires MAGMA op by op (pytorch#172824 svd, #173370 eig, #173788 qr, #174109
triangular_solve, #174248 lu_solve, #174619 eigh, #174769 cholesky_solve, #190661 lu_factor, ...): such an op
warns that MAGMA is deprecated and runs something else. That op no longer exercises MAGMA, so its MAGMA case is
not applicable to this torch; the case says so with torch's own warning (and what the replacement raised, if it
did: upstream's 2.11.0+cu130 on an H200 raises CUSOLVER_STATUS_INVALID_VALUE for this batch of wide matrices
when MAGMA is preferred, and computes it when cuSOLVER is). Which ops still reach MAGMA is read from torch at
run time, never from its version.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator

import pytest
import torch

from torchkiln.verify import report, smoke

pytestmark = pytest.mark.release

DTYPES = {"float32": torch.float32, "float64": torch.float64}


@contextlib.contextmanager
def preferred(library: str) -> Iterator[list[warnings.WarningMessage]]:
    """``library`` preferred for the block, every warning recorded: torch warns once per process unless
    ``torch.set_warn_always`` says otherwise, and a MAGMA deprecation must be seen by each case."""
    previous, always = torch.backends.cuda.preferred_linalg_library(), torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    torch.backends.cuda.preferred_linalg_library(library)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield caught
    finally:
        torch.backends.cuda.preferred_linalg_library(previous)
        torch.set_warn_always(always)


def run_preferring(library: str, op: str, run: Callable[[], object]) -> object:
    """``run()`` (CUDA work, synchronized) with ``library`` preferred. With MAGMA preferred, an op torch has
    retired from MAGMA skips as not applicable, quoting torch's warning and anything its replacement raised."""
    if library == "magma" and not torch.cuda.has_magma:
        pytest.skip(report.not_applicable("built without MAGMA (torch.cuda.has_magma is False)"))
    error: Exception | None = None
    with preferred(library) as caught:
        try:
            result = run()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - re-raised below unless torch retired the op from MAGMA
            error = exc
    retired = smoke.magma_retirement(op, [str(w.message) for w in caught]) if library == "magma" else None
    if retired:
        raised = f"; what torch ran instead raised: {type(error).__name__}: {error}" if error else ""
        pytest.skip(
            report.not_applicable(
                f"torch {torch.__version__} no longer runs {op} through MAGMA (its warning: {retired}){raised}"
            )
        )
    if error is not None:
        raise error
    return result


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("library", ["cusolver", "magma"])
def test_cuda_batched_svd(library: str, dtype: str) -> None:
    """test_linalg('cuda'): SVD of a (20, 16, 50, 100) batch, through each library the build has; the
    singular values against LAPACK's on the CPU, the factors against the input."""
    a = torch.randn(20, 16, 50, 100, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    on_device = a.to(device="cuda", dtype=DTYPES[dtype])
    u, s, vh = run_preferring(library, "linalg.svd", lambda: torch.linalg.svd(on_device, full_matrices=False))
    tol = 1e-3 if dtype == "float32" else 1e-9
    torch.testing.assert_close(s.double().cpu(), torch.linalg.svdvals(a), rtol=tol, atol=tol)
    torch.testing.assert_close(((u * s.unsqueeze(-2)) @ vh).double().cpu(), a, rtol=tol, atol=tol)


# --- every op torch has routed through MAGMA: run on CUDA with MAGMA preferred, checked on the CPU -----------

N = 64
Case = tuple[
    list[torch.Tensor], Callable, Callable
]  # inputs on the CPU, the op on CUDA tensors, its identity


def _well_conditioned(g: torch.Generator, batch: int = 8, n: int = N) -> torch.Tensor:
    return torch.randn(batch, n, n, dtype=torch.float64, generator=g) + n * torch.eye(n, dtype=torch.float64)


def _spd(g: torch.Generator) -> torch.Tensor:
    a = torch.randn(8, N, N, dtype=torch.float64, generator=g)
    return a @ a.mT + N * torch.eye(N, dtype=torch.float64)


def _cuda(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.cuda() for t in tensors]


def _cpu(result: object) -> object:
    if isinstance(result, torch.Tensor):
        return result.cpu()
    return tuple(_cpu(item) for item in result)  # a tuple or torch's named tuple of tensors


def _close(got: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(got, expected, rtol=1e-8, atol=1e-8)


def _lu_factor(g: torch.Generator) -> Case:
    a = torch.randn(16, N, N, dtype=torch.float64, generator=g)

    def check(out: tuple[torch.Tensor, torch.Tensor]) -> None:
        permutation, lower, upper = torch.lu_unpack(*out)
        _close(permutation @ lower @ upper, a)

    return [a], torch.linalg.lu_factor, check


def _solve(g: torch.Generator, a: torch.Tensor, operand: torch.Tensor, solve: Callable) -> Case:
    """A solve of A X = B: ``solve(operand, B)`` on CUDA (``operand``: A or its factor), X against A X = B."""
    b = torch.randn(8, N, 4, dtype=torch.float64, generator=g)
    return [operand, b], solve, lambda x: _close(a @ x, b)


def _lu_solve(g: torch.Generator) -> Case:
    a = _well_conditioned(g)
    return _solve(g, a, a, lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b))


def _cholesky(g: torch.Generator) -> Case:
    a = _spd(g)
    return [a], torch.linalg.cholesky, lambda low: _close(low @ low.mT, a)


def _cholesky_solve(g: torch.Generator) -> Case:
    a = _spd(g)
    return _solve(g, a, torch.linalg.cholesky(a), lambda low, b: torch.cholesky_solve(b, low))


def _cholesky_inverse(g: torch.Generator) -> Case:
    a = _spd(g)
    eye = torch.eye(N, dtype=torch.float64).expand_as(a)
    return [torch.linalg.cholesky(a)], torch.cholesky_inverse, lambda inv: _close(inv @ a, eye)


def _qr(g: torch.Generator) -> Case:
    a = torch.randn(8, N, 48, dtype=torch.float64, generator=g)
    return [a], torch.linalg.qr, lambda out: _close(out[0] @ out[1], a)


def _eigh(g: torch.Generator) -> Case:
    a = _spd(g)
    return [a], torch.linalg.eigh, lambda out: _close(a @ out[1], out[1] * out[0].unsqueeze(-2))


def _eig(g: torch.Generator) -> Case:
    a = torch.randn(4, 32, 32, dtype=torch.float64, generator=g)
    return (
        [a],
        torch.linalg.eig,
        lambda out: _close(a.to(out[1].dtype) @ out[1], out[1] * out[0].unsqueeze(-2)),
    )


def _solve_triangular(g: torch.Generator) -> Case:
    upper = _well_conditioned(g).triu()
    return _solve(g, upper, upper, lambda u, b: torch.linalg.solve_triangular(u, b, upper=True))


def _ldl(g: torch.Generator) -> Case:
    a = _spd(g)
    return _solve(g, a, a, lambda a, b: torch.linalg.ldl_solve(*torch.linalg.ldl_factor(a), b))


# op name (as torch's API names it) -> (inputs on the CPU, the op on CUDA tensors, the identity its result meets)
MAGMA_OPS: dict[str, Callable[[torch.Generator], Case]] = {
    "linalg.lu_factor": _lu_factor,
    "linalg.lu_solve": _lu_solve,
    "linalg.cholesky": _cholesky,
    "cholesky_solve": _cholesky_solve,
    "cholesky_inverse": _cholesky_inverse,
    "linalg.qr": _qr,
    "linalg.eigh": _eigh,
    "linalg.eig": _eig,
    "linalg.solve_triangular": _solve_triangular,
    "linalg.ldl_factor": _ldl,
}


@pytest.mark.cuda
@pytest.mark.parametrize("op", list(MAGMA_OPS))
def test_cuda_op_with_magma_preferred(op: str) -> None:
    """Each op run on CUDA with MAGMA preferred meets its identity on the CPU in float64 (P L U = A,
    L Lᴴ = A, Q R = A, A V = V Λ, A X = B)."""
    inputs, run, check = MAGMA_OPS[op](torch.Generator().manual_seed(0))
    on_device = _cuda(*inputs)
    check(_cpu(run_preferring("magma", op, lambda: run(*on_device))))
