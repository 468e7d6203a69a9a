"""The weighted regressions of KernelSHAP and LIME, as scikit-learn solves them (Captum 0.9.0 fits
``sklearn.linear_model.LinearRegression`` / ``Lasso`` with ``sample_weight``): an intercept left unpenalised by
centring ``X`` and ``y`` on their weighted means, then

* ``linear``: least squares on the centred data scaled by ``sqrt(w)``, the minimum-norm solution when it is
  rank-deficient (LAPACK ``gelsd``, as ``scipy.linalg.lstsq``);
* ``efficient``: KernelSHAP's least squares with its end constraints exact (:func:`efficient_linear_regression`);
* ``lasso``: ``min (1 / (2 sum w)) sum_i w_i (y_i - x_i b)^2 + alpha ||b||_1`` by cyclic coordinate descent
  (Friedman et al. 2010, Eq. 5) until no coefficient moves by more than ``tol`` times the largest one.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def _centred(X: Tensor, y: Tensor, w: Tensor):
    X, y, w = X.double().cpu(), y.double().cpu(), w.double().cpu()
    total = w.sum()
    x_mean, y_mean = (w[:, None] * X).sum(dim=0) / total, (w * y).sum() / total
    root = w.sqrt()
    return (X - x_mean) * root[:, None], (y - y_mean) * root, total


def weighted_linear_regression(X: Tensor, y: Tensor, w: Tensor) -> Tensor:
    """Coefficients ``[M]`` (float64, CPU) of the weighted least squares with an intercept (module docstring)."""
    Xs, ys, _ = _centred(X, y, w)
    return torch.linalg.lstsq(Xs, ys[:, None], driver="gelsd").solution[:, 0]


def efficient_linear_regression(X: Tensor, y: Tensor, w: Tensor, full: float, empty: float) -> Tensor:
    """KernelSHAP's regression with its two constraints exact (Lundberg & Lee 2017, the infinite weight of the
    all-present and all-absent coalitions): intercept ``empty`` and coefficients summing to ``full - empty``; the
    last coefficient is eliminated and the rest solved by weighted least squares (minimum norm)."""
    X, y, w = X.double().cpu(), y.double().cpu(), w.double().cpu()
    change = full - empty
    root = w.sqrt()
    last = X[:, -1:]
    A = (X[:, :-1] - last) * root[:, None]
    b = (y - empty - last[:, 0] * change) * root
    head = torch.linalg.lstsq(A, b[:, None], driver="gelsd").solution[:, 0]
    return torch.cat([head, (change - head.sum())[None]])


def weighted_lasso(X: Tensor, y: Tensor, w: Tensor, alpha: float, tol: float = 1e-12,
                   max_iter: int = 100000) -> Tensor:
    """Coefficients ``[M]`` (float64, CPU) of the weighted Lasso with an intercept (module docstring)."""
    Xs, ys, total = _centred(X, y, w)
    A, r = Xs.numpy().copy(), ys.numpy().copy()
    norms = (A * A).sum(axis=0)
    beta = np.zeros(A.shape[1])
    threshold = alpha * float(total)
    for _ in range(max_iter):
        largest_step = 0.0
        for j in range(A.shape[1]):
            if norms[j] == 0.0:
                continue
            old = beta[j]
            rho = A[:, j] @ r + norms[j] * old
            new = np.sign(rho) * max(abs(rho) - threshold, 0.0) / norms[j]
            if new != old:
                r -= A[:, j] * (new - old)
                beta[j] = new
                largest_step = max(largest_step, abs(new - old))
        if largest_step <= tol * max(1.0, float(np.abs(beta).max())):
            break
    return torch.from_numpy(beta)
