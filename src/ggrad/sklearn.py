"""scikit-learn estimators trained with ggrad: `MLPClassifier`, `MLPRegressor`.

They follow scikit-learn's conventions (validated input, `fit` returns self, learned
attributes end in `_`, `get_params`/`set_params`, pickling) and pass its
`check_estimator` suite. The learned weights are kept as numpy arrays (`coefs_`,
`intercepts_`); the ggrad model is rebuilt from them when needed, so a fitted estimator
pickles and clones like any other.

`device=None` (the default) runs on the caller's current device. A named device is
switched to for the call and the caller's device given back afterwards (the caller's
kept tensors stay readable; a call that would switch inside a recording grad_tape, whose
values would end, is refused).
"""

from __future__ import annotations

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.preprocessing import LabelEncoder
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from . import functional as F
from . import nn
from .autograd import grad_tape, is_recording, no_grad
from .data import DataLoader
from .optim import Adam
from .random import manual_seed
from .runtime import backend as _backend
from .runtime import device as use_device
from .runtime import get_device
from .tensor import tensor

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "logistic": nn.Sigmoid, "gelu": nn.GELU}


class _BaseMLP(BaseEstimator):
    def __init__(self, hidden_layer_sizes=(100,), activation="relu", lr=1e-3, epochs=200,
                 batch_size=200, device=None, random_state=None):
        self.hidden_layer_sizes = hidden_layer_sizes
        self.activation = activation
        self.lr = lr
        self.epochs = epochs
        self.batch_size = batch_size
        self.device = device
        self.random_state = random_state

    # ---- where it runs ----------------------------------------------------------------------
    def _on_device(self):
        """Run on `device` (None: the caller's current device), and give the caller's device
        back afterwards. ggrad runs one device at a time: switching moves the caller's
        kept tensors to the host (they stay readable and move back on use) but ends the
        values of a grad tape that is recording, so a switch there is refused."""
        if self.device is None or _backend.resolve(self.device) == get_device():
            return use_device(get_device())
        if is_recording():
            raise RuntimeError(f"{type(self).__name__}(device={self.device!r}) would switch the device from "
                               f"{get_device()!r} inside a grad_tape, whose values live there; call it "
                               "outside the tape, or pass device=None (the current device)")
        return use_device(self.device)

    # ---- the network, from and to numpy ------------------------------------------------
    def _check_params(self) -> list[int]:
        sizes = [self.hidden_layer_sizes] if np.isscalar(self.hidden_layer_sizes) else list(self.hidden_layer_sizes)
        if any(int(s) < 1 for s in sizes):
            raise ValueError(f"hidden_layer_sizes must be positive, got {self.hidden_layer_sizes}")
        if self.activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {self.activation!r}")
        if not self.lr > 0 or int(self.epochs) < 1 or int(self.batch_size) < 1:
            raise ValueError("lr, epochs and batch_size must be positive")
        return [int(s) for s in sizes]

    def _build(self, n_in: int, n_out: int) -> nn.Module:
        sizes = [n_in, *self._check_params(), n_out]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(_ACTIVATIONS[self.activation]())
        return nn.Sequential(*layers)

    def _model(self) -> nn.Module:
        model = self.__dict__.get("_net")
        if model is None:
            model = self._build(self.coefs_[0].shape[1], self.coefs_[-1].shape[0])
            linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
            with no_grad():
                for layer, w, b in zip(linears, self.coefs_, self.intercepts_):
                    layer.weight.assign_(w)
                    layer.bias.assign_(b)
            self._net = model
        return model

    def _keep_weights(self, model: nn.Module) -> None:
        linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
        self.coefs_ = [layer.weight.numpy() for layer in linears]
        self.intercepts_ = [layer.bias.numpy() for layer in linears]
        self._net = model

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_net", None)
        state.pop("_optimizer", None)
        return state

    # ---- training ------------------------------------------------------------------------
    def _train(self, x: np.ndarray, target: np.ndarray, n_out: int, loss_fn, epochs: int, first: bool) -> None:
        if is_recording():  # its own tapes would start a new pass: the caller's values would end
            raise RuntimeError(f"{type(self).__name__}.fit inside a grad_tape would end the tape's values; "
                               "fit outside the tape")
        with self._on_device():
            if first:
                if self.random_state is not None:
                    manual_seed(np.random.RandomState(self.random_state).randint(2**31 - 1))
                model = self._build(x.shape[1], n_out)
                self._optimizer = Adam(model.parameters(), lr=float(self.lr))
            else:
                model = self._model()
                if "_optimizer" not in self.__dict__:
                    self._optimizer = Adam(model.parameters(), lr=float(self.lr))
            seed = None if self.random_state is None else int(np.random.RandomState(self.random_state).randint(2**31 - 1))
            loader = DataLoader(x, target, batch_size=min(int(self.batch_size), len(x)), shuffle=True, seed=seed)
            model.train()
            for _ in range(epochs):
                for xb, yb in loader:
                    with grad_tape():
                        loss_fn(model(xb), yb).backward()
                    self._optimizer.step()
                    self._optimizer.zero_grad()
            self._keep_weights(model)
            self.n_iter_ = getattr(self, "n_iter_", 0) + epochs

    def _forward(self, X) -> np.ndarray:
        check_is_fitted(self, "coefs_")
        X = validate_data(self, X, reset=False, dtype=np.float32)
        with self._on_device(), no_grad():
            model = self._model()
            model.eval()
            return model(tensor(X)).numpy().astype(np.float64)


class MLPClassifier(ClassifierMixin, _BaseMLP):
    """A multilayer perceptron classifier trained with Adam on softmax cross-entropy."""

    def fit(self, X, y):
        self.__dict__.pop("_net", None)
        self.__dict__.pop("n_iter_", None)
        return self._fit(X, y, first=True, classes=None)

    def partial_fit(self, X, y, classes=None):
        first = not hasattr(self, "coefs_")
        if first and classes is None:
            raise ValueError("the first call to partial_fit needs classes=")
        return self._fit(X, y, first=first, classes=classes, epochs=1)

    def _fit(self, X, y, first: bool, classes, epochs: int | None = None):
        X, y = validate_data(self, X, y, reset=first, dtype=np.float32)
        check_classification_targets(y)
        if first:
            self._encoder = LabelEncoder().fit(classes if classes is not None else y)
            self.classes_ = self._encoder.classes_
        elif np.setdiff1d(np.unique(y), self.classes_).size:
            raise ValueError(f"y holds classes not in classes_ {self.classes_}")
        target = self._encoder.transform(y).astype(np.int32)
        self._train(X, target, len(self.classes_), F.cross_entropy, epochs or int(self.epochs), first)
        return self

    def predict_proba(self, X) -> np.ndarray:
        logits = self._forward(X)
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def predict(self, X) -> np.ndarray:
        logits = self._forward(X)
        return self.classes_[np.argmax(logits, axis=1)]


class MLPRegressor(RegressorMixin, _BaseMLP):
    """A multilayer perceptron regressor trained with Adam on mean squared error; y may
    have several columns (one output each)."""

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags

    def fit(self, X, y):
        self.__dict__.pop("_net", None)
        self.__dict__.pop("n_iter_", None)
        return self._fit(X, y, first=True)

    def partial_fit(self, X, y):
        return self._fit(X, y, first=not hasattr(self, "coefs_"), epochs=1)

    def _fit(self, X, y, first: bool, epochs: int | None = None):
        X, y = validate_data(self, X, y, reset=first, dtype=np.float32, y_numeric=True, multi_output=True)
        y = y.astype(np.float32)
        if first:
            self._single_output = y.ndim == 1
        y2 = y.reshape(len(y), -1)
        self._train(X, y2, y2.shape[1], F.mse_loss, epochs or int(self.epochs), first)
        return self

    def predict(self, X) -> np.ndarray:
        out = self._forward(X)
        return out[:, 0] if self._single_output else out
