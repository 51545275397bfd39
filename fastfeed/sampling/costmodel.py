"""What a batch of variable-length samples costs: a small linear model over its lengths.

The samplers balance work between ranks by *cost*. A :class:`CostModel` predicts the
cost of one batch as a non-negative combination of five features of its lengths
``l_1 .. l_n``:

============  ==================  ===============================================
feature       value               what it stands for
============  ==================  ===============================================
``const``     1                   per-step overhead (optimizer, launches, sync)
``padded``    ``n * max(l)``      dense layers on a padded ``[n, max]`` batch
``padded_sq`` ``n * max(l)**2``   attention on a padded batch (e.g. torch SDPA)
``tokens``    ``sum(l)``          dense layers on packed / varlen input
``tokens_sq`` ``sum(l**2)``       varlen attention (per-sequence, cu_seqlens)
============  ==================  ===============================================

Built-in models (units are "token equivalents", no fitting needed):

- :meth:`CostModel.tokens_model`: ``n * max`` (padded tokens);
- :meth:`CostModel.attention`: ``n * max + n * max**2 / (6 * d_model)``;
- :meth:`CostModel.varlen`: ``sum(l) + sum(l**2) / (6 * d_model)``.

Why ``6 * d_model``: per layer and per token, a transformer's dense layers cost about
``24 d**2`` FLOPs (QKV ``6 d**2``, output ``2 d**2``, a 4x MLP ``16 d**2``) and its attention
about ``4 L d`` (scores and values, no causal saving), so a token of a length-``L``
sequence costs ``24 d**2 (1 + L / (6 d))``.

A *fitted* model (:func:`fit_cost_model`, or :func:`fastfeed.calibrate` that times your
own step) predicts seconds, so a sampler's ``max_cost`` can be "0.12 s per step".

Example:
    >>> m = CostModel(const=0.002, padded=1e-6, padded_sq=2e-10, unit="seconds")
    >>> round(m.predict([100, 200, 300]) * 1000, 3)   # ms
    2.954
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from fastfeed.errors import ConfigError
from fastfeed.packed.index import atomic_write_bytes

__all__ = [
    "FEATURES",
    "CostModel",
    "FitReport",
    "PoorFitWarning",
    "batch_features",
    "fit_cost_model",
]

log = logging.getLogger(__name__)

#: Feature names, in the order of :func:`batch_features` columns.
FEATURES: tuple[str, ...] = ("const", "padded", "padded_sq", "tokens", "tokens_sq")
_FORMAT_VERSION = 1


class PoorFitWarning(UserWarning):
    """A fitted cost model predicts the measured step times poorly."""


@dataclass(frozen=True)
class FitReport:
    """How well a fitted :class:`CostModel` predicts the records it was fitted on.

    Attributes:
        num_records: records used in the fit (after dropping outliers).
        median_ape: median absolute percentage error, as a fraction (0.03 = 3%).
        worst_ape: largest absolute percentage error over the records used.
        loo_median_ape: median error when each record is predicted by a model fitted
            without it (leave-one-out; 10-fold beyond 50 records): what to expect on
            new batches.
        r2: coefficient of determination of the predicted seconds.
        outliers: records left out as outliers (their positions in the input).
        features: the features the fit was allowed to use.
    """

    num_records: int
    median_ape: float
    worst_ape: float
    loo_median_ape: float
    r2: float
    outliers: tuple[int, ...] = ()
    features: tuple[str, ...] = FEATURES

    def summary(self) -> str:
        out = f", {len(self.outliers)} outlier(s) left out" if self.outliers else ""
        return (
            f"fit on {self.num_records} records{out}: median |error| {self.median_ape:.1%}, "
            f"worst {self.worst_ape:.1%}, leave-one-out median {self.loo_median_ape:.1%}, "
            f"R^2 {self.r2:.4f}"
        )


@dataclass(frozen=True)
class CostModel:
    """cost(batch) = const + padded*n*max + padded_sq*n*max^2 + tokens*sum(l) + tokens_sq*sum(l^2).

    All coefficients are non-negative, so adding a sample or lengthening one never makes
    a batch cheaper (the samplers rely on this).

    Attributes:
        const, padded, padded_sq, tokens, tokens_sq: the coefficients (see module doc).
        unit: what a cost means: ``"tokens"``, ``"token-equivalents"`` or ``"seconds"``.
        name: a short label (``"tokens"``, ``"attention"``, ``"fitted"``...).
        fit: the fit report of a fitted model, else None.
        meta: free-form provenance (model, GPU, date) saved with the model.

    Example:
        >>> CostModel.attention(d_model=1024).predict([1024] * 4)  # 4 * 1024 * (1 + 1024 / 6144)
        4778.666666666667
    """

    const: float = 0.0
    padded: float = 0.0
    padded_sq: float = 0.0
    tokens: float = 0.0
    tokens_sq: float = 0.0
    unit: str = "tokens"
    name: str = "custom"
    fit: FitReport | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for f in FEATURES:
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ConfigError(f"CostModel.{f}={v!r} must be a finite number >= 0")
        if not any(getattr(self, f) for f in FEATURES[1:]):
            raise ConfigError(
                "CostModel needs a positive coefficient on at least one length feature "
                "(padded, padded_sq, tokens or tokens_sq); a constant cost cannot balance anything"
            )

    # ------------------------------------------------------------------ built-ins
    @classmethod
    def tokens_model(cls) -> "CostModel":
        """Padded tokens: ``n * max(l)`` (the ``cost="tokens"`` default)."""
        return cls(padded=1.0, unit="tokens", name="tokens")

    @classmethod
    def attention(cls, d_model: int = 1024) -> "CostModel":
        """Padded transformer: ``n*max + n*max**2 / (6*d_model)`` token equivalents."""
        _check_width(d_model)
        return cls(padded=1.0, padded_sq=1.0 / (6 * d_model), unit="token-equivalents",
                   name=f"attention(d_model={d_model})")

    @classmethod
    def varlen(cls, d_model: int = 1024) -> "CostModel":
        """Packed / varlen transformer: ``sum(l) + sum(l**2) / (6*d_model)``."""
        _check_width(d_model)
        return cls(tokens=1.0, tokens_sq=1.0 / (6 * d_model), unit="token-equivalents",
                   name=f"varlen(d_model={d_model})")

    @classmethod
    def builtin(cls, name: str) -> "CostModel":
        """``"tokens"``, ``"attention"`` or ``"varlen"`` (d_model 1024)."""
        makers = {"tokens": cls.tokens_model, "attention": cls.attention, "varlen": cls.varlen}
        if name not in makers:
            raise ConfigError(
                f"cost={name!r} is not a built-in cost; use one of {sorted(makers)}, "
                "a CostModel (e.g. CostModel.load('fit.json')) or a callable(lengths) -> float"
            )
        return makers[name]()

    # ------------------------------------------------------------------ evaluation
    @property
    def coefficients(self) -> np.ndarray:
        """The coefficients as a float64 array in :data:`FEATURES` order."""
        return np.array([getattr(self, f) for f in FEATURES], dtype=np.float64)

    @property
    def has_additive(self) -> bool:
        """True when the model has a per-sample (varlen) term, not only padded ones."""
        return self.tokens > 0 or self.tokens_sq > 0

    def cost_from_features(
        self, n: np.ndarray, maxlen: np.ndarray, sum_l: np.ndarray, sum_sq: np.ndarray
    ) -> np.ndarray:
        """Vectorised batch costs from per-batch (count, max, sum, sum of squares)."""
        n = np.asarray(n, dtype=np.float64)
        mx = np.asarray(maxlen, dtype=np.float64)
        return (self.const + self.padded * n * mx + self.padded_sq * n * mx * mx
                + self.tokens * np.asarray(sum_l, dtype=np.float64)
                + self.tokens_sq * np.asarray(sum_sq, dtype=np.float64))

    def predict(self, batch: Sequence[int] | np.ndarray | Iterable[Sequence[int]]) -> Any:
        """Cost of one batch (a sequence of lengths) or of a list of batches.

        Example:
            >>> CostModel.tokens_model().predict([[10, 20], [5]])
            array([40.,  5.])
        """
        if _is_batch_list(batch):
            return batch_features(batch) @ self.coefficients
        return float(batch_features([batch])[0] @ self.coefficients)

    def __call__(self, lengths: Sequence[int] | np.ndarray) -> float:
        return float(self.predict(lengths))

    def per_sample_at(self, length: np.ndarray) -> np.ndarray:
        """Cost one sample adds to a batch whose longest sample has this length.

        The bound the samplers plan with: a batch of ``n`` samples no longer than
        ``L`` costs at most ``const + n * per_sample_at(L)``.
        """
        L = np.asarray(length, dtype=np.float64)
        return (self.padded + self.tokens) * L + (self.padded_sq + self.tokens_sq) * L * L

    def capacity(self, maxlen: np.ndarray, budget: float) -> np.ndarray:
        """Most samples of length <= ``maxlen`` a batch can hold within ``budget`` (int64)."""
        per = self.per_sample_at(maxlen)
        room = budget - self.const
        with np.errstate(divide="ignore"):  # 1e-9: n * per == room exactly must count as fitting
            cap = np.floor(np.where(per > 0, room / np.maximum(per, 1e-300) * (1 + 1e-9), np.inf))
        return np.clip(cap, 0, 2**62).astype(np.int64)

    # ------------------------------------------------------------------ I/O
    def to_json(self) -> dict[str, Any]:
        return {
            "fastfeed_cost_model": _FORMAT_VERSION,
            "name": self.name,
            "unit": self.unit,
            "coefficients": {f: getattr(self, f) for f in FEATURES},
            "fit": None if self.fit is None else asdict(self.fit),
            "meta": dict(self.meta),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], where: str = "cost model") -> "CostModel":
        if d.get("fastfeed_cost_model") != _FORMAT_VERSION:
            raise ConfigError(
                f"{where}: not a fastfeed cost model of format version {_FORMAT_VERSION} "
                f"(found {d.get('fastfeed_cost_model')!r}); re-run fastfeed.calibrate / fit_cost_model"
            )
        coef = d.get("coefficients", {})
        unknown = set(coef) - set(FEATURES)
        if unknown:
            raise ConfigError(f"{where}: unknown features {sorted(unknown)}; known: {list(FEATURES)}")
        fit = d.get("fit")
        if fit is not None:
            fit = FitReport(**{**fit, "outliers": tuple(fit.get("outliers", ())),
                               "features": tuple(fit.get("features", FEATURES))})
        try:
            return cls(**{f: float(coef.get(f, 0.0)) for f in FEATURES}, unit=str(d.get("unit", "")),
                       name=str(d.get("name", "custom")), fit=fit, meta=dict(d.get("meta", {})))
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the model as a small JSON file (atomically); returns the path."""
        path = Path(path)
        atomic_write_bytes(path, (json.dumps(self.to_json(), indent=1) + "\n").encode("utf-8"))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "CostModel":
        """Read a model written by :meth:`save`.

        Example:
            >>> m = CostModel.load("step_cost.json")   # doctest: +SKIP
        """
        try:
            d = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such cost model file; create it with fastfeed.calibrate") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e})") from None
        return cls.from_json(d, where=str(path))

    def summary(self) -> str:
        """A readable one-line formula, plus the fit quality when fitted.

        Example:
            >>> print(CostModel.attention(512).summary())
            cost = 1 x n*max + 0.0003255 x n*max^2  [token-equivalents; attention(d_model=512)]
        """
        terms = [(self.const, "1"), (self.padded, "n*max"), (self.padded_sq, "n*max^2"),
                 (self.tokens, "sum(l)"), (self.tokens_sq, "sum(l^2)")]
        fmt = _format_seconds if self.unit == "seconds" else (lambda v: f"{v:.4g}")
        parts = [fmt(v) if what == "1" else f"{fmt(v)} x {what}" for v, what in terms if v > 0]
        text = f"cost = {' + '.join(parts)}  [{self.unit}; {self.name}]"
        if self.fit is not None:
            text += "\n" + self.fit.summary()
        return text

    def describe(self) -> dict[str, Any]:
        """Identity of the model (coefficients and unit) for sampler state dicts."""
        return {"name": self.name, "unit": self.unit,
                **{f: float(getattr(self, f)) for f in FEATURES}}


def _check_width(d_model: int) -> None:
    if not isinstance(d_model, int) or d_model <= 0:
        raise ConfigError(f"d_model={d_model!r} must be a positive integer (the model width)")


def _format_seconds(v: float) -> str:
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")):
        if v >= scale:
            return f"{v / scale:.4g} {unit}"
    return f"{v / 1e-12:.4g} ps"


def _is_batch_list(x: Any) -> bool:
    if isinstance(x, np.ndarray):
        return x.dtype == object or x.ndim == 2
    if isinstance(x, (list, tuple)) and x:
        return isinstance(x[0], (list, tuple, np.ndarray))
    return False


def batch_features(batches: Iterable[Sequence[int] | np.ndarray]) -> np.ndarray:
    """(B, 5) float64 features of each batch, columns in :data:`FEATURES` order.

    Example:
        >>> batch_features([[2, 3]]).tolist()
        [[1.0, 6.0, 18.0, 5.0, 13.0]]
    """
    rows = []
    for i, b in enumerate(batches):
        a = np.asarray(b, dtype=np.float64).ravel()
        if a.size == 0:
            raise ConfigError(f"batch {i} is empty; a batch needs at least one length")
        if not np.all(np.isfinite(a)) or a.min() < 0:
            raise ConfigError(f"batch {i}: lengths must be finite and >= 0, got {a.tolist()[:8]}")
        mx = a.max()
        rows.append((1.0, a.size * mx, a.size * mx * mx, a.sum(), (a * a).sum()))
    return np.array(rows, dtype=np.float64).reshape(-1, len(FEATURES))


# ---------------------------------------------------------------------- fitting
_FEATURE_SETS = {
    "all": FEATURES,
    "padded": ("const", "padded", "padded_sq"),
    "varlen": ("const", "tokens", "tokens_sq"),
}


def _parse_records(records: Iterable[Any]) -> tuple[list[np.ndarray], np.ndarray]:
    batches, secs = [], []
    for i, r in enumerate(records):
        if isinstance(r, Mapping):
            if "lengths" not in r or not ({"seconds", "time"} & set(r)):
                raise ConfigError(f"record {i}: a mapping needs 'lengths' and 'seconds' keys, got {sorted(r)}")
            lens, t = r["lengths"], r.get("seconds", r.get("time"))
        else:
            try:
                lens, t = r
            except (TypeError, ValueError):
                raise ConfigError(
                    f"record {i}: expected a (lengths, seconds) pair or a mapping, got {type(r).__name__}"
                ) from None
        t = float(t)
        if not (math.isfinite(t) and t > 0):
            raise ConfigError(f"record {i}: measured seconds={t!r} must be a positive number")
        batches.append(np.asarray(lens))
        secs.append(t)
    return batches, np.array(secs, dtype=np.float64)


def _nnls(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares for a handful of columns.

    The optimum's support is some subset of the columns, and on its support it is the
    ordinary least-squares solution; so solving every subset (at most 2^5 - 1 here) and
    keeping the best feasible one is exact. For five features this is simpler and as
    fast as an active-set solver, and avoids a scipy dependency for one tiny solve.
    """
    k = A.shape[1]
    scale = np.linalg.norm(A, axis=0)
    scale[scale == 0] = 1.0
    As = A / scale
    best, best_res = np.zeros(k), float(np.dot(y, y))
    for r in range(1, k + 1):
        for cols in itertools.combinations(range(k), r):
            sub = As[:, cols]
            coef, *_ = np.linalg.lstsq(sub, y, rcond=None)
            if np.any(coef < -1e-12 * max(1.0, np.abs(coef).max())):
                continue
            res = float(np.sum((sub @ coef - y) ** 2))
            if res < best_res - 1e-15 * max(1.0, best_res):
                best_res = res
                best = np.zeros(k)
                best[list(cols)] = np.maximum(coef, 0.0)
    return best / scale


def _fit_relative(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    # minimise the squared *relative* error: rows weighted by 1 / measured time
    return _nnls(X / y[:, None], np.ones_like(y))


def fit_cost_model(
    records: Iterable[Any],
    *,
    features: str | Sequence[str] = "all",
    robust: bool = True,
    warn_above: float = 0.05,
    name: str = "fitted",
    meta: Mapping[str, Any] | None = None,
) -> CostModel:
    """Fit a :class:`CostModel` in seconds from measured steps.

    Minimises the squared relative error with non-negative coefficients, so short and
    long steps count alike. Reports the fit quality and warns (:class:`PoorFitWarning`)
    when the median error exceeds ``warn_above`` or the worst exceeds 4x that.

    Args:
        records: ``(lengths, seconds)`` pairs or mappings with ``lengths`` and ``seconds``:
            the lengths of one batch and the measured time of one step on it.
        features: ``"all"``, ``"padded"`` (const, n*max, n*max^2), ``"varlen"`` (const,
            sum l, sum l^2) or an explicit list of :data:`FEATURES` names.
        robust: leave out (and report) records far off the first fit, at most 10%.
        warn_above: median relative error above which the fit is called poor.
        name: label stored in the model.
        meta: provenance saved with the model (model name, GPU, ...).

    Example:
        >>> recs = [([L] * n, 1e-3 + 2e-7 * n * L) for L in (64, 256, 1024) for n in (1, 4, 16)]
        >>> m = fit_cost_model(recs, features="padded")
        >>> round(m.const * 1e3, 3), round(m.padded * 1e7, 3)
        (1.0, 2.0)
    """
    feats = _FEATURE_SETS.get(features, features) if isinstance(features, str) else tuple(features)
    if isinstance(feats, str) or not feats or set(feats) - set(FEATURES):
        raise ConfigError(f"features={features!r}: use 'all', 'padded', 'varlen' or names from {list(FEATURES)}")
    batches, y = _parse_records(records)
    cols = [FEATURES.index(f) for f in feats]
    if len(y) < len(cols) + 2:
        raise ConfigError(
            f"fit_cost_model needs at least {len(cols) + 2} records for {len(cols)} features, got {len(y)}; "
            "measure more steps (fastfeed.calibrate runs a varied set for you)"
        )
    X = batch_features(batches)[:, cols]
    keep = np.arange(len(y))
    coef = _fit_relative(X, y)
    outliers: tuple[int, ...] = ()
    if robust:
        ape = np.abs(X @ coef - y) / y
        limit = max(4.0 * float(np.median(ape)), 0.10)
        bad = np.flatnonzero(ape > limit)
        if 0 < len(bad) <= 0.1 * len(y) and len(y) - len(bad) >= len(cols) + 2:
            bad = bad[np.argsort(-ape[bad])]
            outliers = tuple(int(i) for i in sorted(bad))
            keep = np.setdiff1d(keep, bad)
            coef = _fit_relative(X[keep], y[keep])
    report = _report(X[keep], y[keep], coef, outliers, tuple(feats))
    full = np.zeros(len(FEATURES))
    full[cols] = coef
    if not np.any(full[1:] > 0):
        raise ConfigError(
            "the measured times do not grow with any length feature (the fit is a constant); "
            "time the step with the GPU synchronised and over batches of clearly different sizes"
        )
    model = CostModel(**dict(zip(FEATURES, map(float, full))), unit="seconds", name=name,
                      fit=report, meta=dict(meta or {}))
    log.info("fitted cost model: %s", model.summary())
    if report.median_ape > warn_above or report.worst_ape > 4 * warn_above:
        warnings.warn(PoorFitWarning(
            f"the cost model fits the measured steps poorly ({report.summary()}). The step time may "
            "not follow these features (try features='all'), the timings may be noisy or unsynchronised "
            "(synchronise the GPU around each step, warm up first), or other work shared the device"
        ), stacklevel=2)
    return model


def _report(X: np.ndarray, y: np.ndarray, coef: np.ndarray, outliers: tuple[int, ...],
            feats: tuple[str, ...]) -> FitReport:
    pred = X @ coef
    ape = np.abs(pred - y) / y
    folds = np.arange(len(y)) % (len(y) if len(y) <= 50 else 10)  # leave-one-out, or 10-fold
    loo = np.empty(len(y))
    for k in np.unique(folds):
        test = folds == k
        c = _fit_relative(X[~test], y[~test])
        loo[test] = np.abs(X[test] @ c - y[test]) / y[test]
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum((pred - y) ** 2)) / ss_tot if ss_tot > 0 else 1.0
    return FitReport(num_records=len(y), median_ape=float(np.median(ape)), worst_ape=float(ape.max()),
                     loo_median_ape=float(np.median(loo)), r2=r2, outliers=outliers, features=feats)
