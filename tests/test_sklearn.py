"""The scikit-learn estimators: scikit-learn's own check suite, pipelines, grid search."""

import numpy as np
import pytest
from sklearn.datasets import load_digits, make_regression
from sklearn.model_selection import GridSearchCV, train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from ggrad.sklearn import MLPClassifier, MLPRegressor


@parametrize_with_checks([MLPClassifier(random_state=0), MLPRegressor(random_state=0)])
def test_scikit_learn_checks(estimator, check):
    check(estimator)


def test_classifier_in_a_pipeline_and_grid_search():
    d = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(d.data, d.target, test_size=0.25, random_state=0)
    pipe = make_pipeline(StandardScaler(), MLPClassifier(hidden_layer_sizes=(64,), epochs=15, batch_size=64,
                                                         random_state=0))
    search = GridSearchCV(pipe, {"mlpclassifier__lr": [1e-3, 3e-3]}, cv=2).fit(x_train, y_train)
    assert search.best_estimator_.score(x_test, y_test) >= 0.93
    proba = search.predict_proba(x_test)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-6)


def test_regressor_and_partial_fit():
    x, y = make_regression(n_samples=200, n_features=5, noise=0.1, random_state=0)
    y = y / y.std()
    model = MLPRegressor(hidden_layer_sizes=(32,), epochs=100, lr=3e-3, random_state=0).fit(x, y)
    assert model.score(x, y) > 0.9
    before = model.score(x, y)
    for _ in range(5):
        model.partial_fit(x, y)
    assert model.n_iter_ == 105 and model.score(x, y) >= before - 0.05
    with pytest.raises(ValueError):
        model.partial_fit(x[:, :3], y)
