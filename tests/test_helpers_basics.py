"""helpers.data, plots, devices (graphs: test_helpers_graphs.py): deterministic, readable, and clear when something is missing."""

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from helpers.data import make_classification_batch, make_linear_regression, make_tanh_regression
from helpers.devices import environment_report, pick_device
from helpers.plots import LECTURE_STYLE, plot_loss_contours, plot_losses, use_lecture_style


def test_datasets_are_seeded_and_shaped():
    X, y, w = make_linear_regression(n=50, d=3, seed=7)
    X2, y2, w2 = make_linear_regression(n=50, d=3, seed=7)
    assert X.shape == (50, 3) and y.shape == (50,) and w.shape == (3,)
    assert torch.equal(X, X2) and torch.equal(y, y2) and torch.equal(w, w2)
    assert not torch.equal(X, make_linear_regression(n=50, d=3, seed=8)[0])
    # the spread of feature scales is what makes the bowl elongated
    scales = X.std(0)
    assert scales[-1] / scales[0] > 2
    Xc, yc = make_classification_batch(n=16, d=4, classes=3, seed=1)
    assert Xc.shape == (16, 4) and yc.dtype == torch.int64 and int(yc.min()) >= 0 and int(yc.max()) < 3


def test_tanh_regression_is_notebook_03s_course_data():
    X, y = make_tanh_regression()
    X_lin, y_lin, _ = make_linear_regression(n=256, d=4, noise=1.0, seed=3, condition=1.0)
    target = torch.tanh(y_lin).unsqueeze(1)
    assert torch.equal(X, X_lin) and y.shape == (256, 1)
    assert torch.equal(y, (target - target.mean()) / target.std())
    assert abs(float(y.mean())) < 1e-6 and abs(float(y.std()) - 1) < 1e-6

def test_lecture_style_is_large():
    use_lecture_style()
    assert plt.rcParams["font.size"] >= 14 and plt.rcParams["lines.linewidth"] >= 2.5
    assert LECTURE_STYLE["axes.titlesize"] >= plt.rcParams["font.size"]


def test_plot_losses_stops_curves_at_the_first_nonfinite_value():
    ax = plot_losses({"ok": [3.0, 2.0, 1.0], "blows up": [1.0, 10.0, math.inf, math.nan]})
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["ok"].get_ydata()) == [3.0, 2.0, 1.0]
    assert list(lines["blows up"].get_ydata()) == [1.0, 10.0]
    assert ax.get_yscale() == "log"
    plt.close("all")


def test_plot_loss_contours_draws_paths_and_minimum():
    center = torch.tensor([1.0, -1.0])
    path = torch.stack([center + torch.tensor([2.0, 2.0]) * 0.5**k for k in range(5)])
    ax = plot_loss_contours(lambda W: ((W - center) ** 2).sum(1), {"gd": path}, center=center, radius=2.5,
                            resolution=30)
    labels = [line.get_label() for line in ax.get_lines()]
    assert "gd" in labels and "minimum" in labels
    plt.close("all")


def test_device_choice_and_report():
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device().type in {"cpu", "cuda"}
    report = environment_report()
    assert report["torch"] == torch.__version__
    assert {"device", "cpu cores", "graphviz dot", "torchviz"} <= set(report)
    assert "nbgrader" not in report  # students never need it; "not installed" read as a problem on Colab
